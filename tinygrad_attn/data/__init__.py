"""Data for training: built-in sequence-to-sequence tasks, character-level
language-model data, batching and attention masks.

    from tinygrad_attn import data
    task = data.ReverseTask(num_symbols=10, length=10)
    batch = task.train_batch(64)        # src, tgt_in, tgt_out + masks
    text = data.CharLMData.from_file("input.txt", block_size=64)
    x, y = text.get_batch("train", 12)

Randomness comes from `tinygrad_attn.random` (seed it with
`tinygrad_attn.manual_seed`), except the held-out sequences of a task, which
have their own seeded generator. See docs/training.md.
"""
from .charlm import CharLMData, CharTokenizer, read_text
from .masks import causal_mask, lengths_to_padding_mask, padding_mask
from .tasks import (TASKS, CopyTask, ReverseTask, Seq2SeqBatch, Seq2SeqTask, SortTask,
                    exact_match, get_task, sequence_matches)
from .vocab import BOS, EOS, NUM_SPECIAL, PAD

__all__ = ["PAD", "BOS", "EOS", "NUM_SPECIAL", "Seq2SeqTask", "Seq2SeqBatch", "CopyTask",
           "ReverseTask", "SortTask", "TASKS", "get_task", "exact_match", "sequence_matches",
           "CharTokenizer", "CharLMData", "read_text", "causal_mask", "padding_mask",
           "lengths_to_padding_mask"]
