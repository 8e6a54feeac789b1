"""What differs between the built-in tasks: data, model, loss, evaluation.

A job turns a resolved `TrainConfig` into a model and its data, and knows
how to compute the training loss of a batch, evaluate, show examples and
pick one example for the attention heatmaps. `Trainer` runs either kind.

Evaluation never draws from the framework's generator (the held-out and
validation sets have their own fixed seeds), so evaluating does not change
the training run: a run resumed from a checkpoint follows the uninterrupted
one exactly, whenever the evaluations happened.
"""
import hashlib
from contextlib import contextmanager

import numpy as np

from .. import data
from .. import functional as F
from ..autograd import no_grad
from ..data.vocab import BOS, EOS, PAD, SPECIAL_NAMES
from ..models import GPT, GPTConfig, Llama, LlamaConfig, Seq2SeqConfig, Seq2SeqTransformer
from .config import LLAMA_MULTIPLE_OF, ConfigError


def make_job(config):
    """The job of a resolved config: Seq2SeqJob or CharLMJob."""
    return Seq2SeqJob(config) if config.is_seq2seq else CharLMJob(config)


@contextmanager
def _eval_mode(model):
    """The model in eval mode (no dropout), building no graph; restored after."""
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            yield
    finally:
        model.train(was_training)


def _record_attention(model, run):
    """Call `run()` with every attention layer recording its weights; return
    [(layer name, weights (heads, L, S))] for the first sequence of the batch."""
    layers = model.attention_layers()
    for _, mha in layers:
        mha.record_weights = True
    try:
        with _eval_mode(model):
            run()
    finally:
        for _, mha in layers:
            mha.record_weights = False
    maps = [(name, mha.last_attn_weights[0]) for name, mha in layers]
    for _, mha in layers:
        mha.last_attn_weights = None
    return maps


class Seq2SeqJob:
    """copy / reverse / sort with the encoder-decoder `Seq2SeqTransformer`.

    Loss: cross-entropy of the decoder's next-token predictions under
    teacher forcing, padding ignored. Periodic evaluation: the same loss and
    the exact-match accuracy on held-out sequences, read from one
    teacher-forced pass (a sequence counts as right when every target token
    is the most likely one given the true prefix, which is exactly when
    greedy decoding reproduces it). The final evaluation decodes greedily.
    """

    kind = "seq2seq"

    def __init__(self, config):
        self.config = config
        self.task = data.get_task(config.task, num_symbols=config.vocab, length=config.seq_len,
                                  min_length=config.min_seq_len)
        self.model = Seq2SeqTransformer(Seq2SeqConfig(
            vocab_size=self.task.vocab_size, d_model=config.d_model, nhead=config.heads,
            num_encoder_layers=config.layers, num_decoder_layers=config.layers,
            dim_feedforward=config.ffn, dropout=config.dropout,
            # room for the target (seq-len + 1 with BOS) and greedy decoding's EOS
            max_len=max(Seq2SeqConfig.max_len, config.seq_len + 2)))
        self.held_out = self.task.held_out_batch(config.eval_size)

    def metadata(self):
        return {}

    def check_metadata(self, metadata):
        pass

    def train_batch(self, batch_size):
        return self.task.train_batch(batch_size)

    @staticmethod
    def num_tokens(batch):
        return batch.num_tokens

    def _logits(self, batch):
        return self.model(batch.src, batch.tgt_in, src_key_padding_mask=batch.src_key_padding_mask,
                          tgt_key_padding_mask=batch.tgt_key_padding_mask)

    def _loss(self, logits, batch):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.tgt_out.reshape(-1),
                               ignore_index=PAD)

    def loss(self, batch):
        return self._loss(self._logits(batch), batch)

    def evaluate(self):
        """{"val_loss", "exact_match"} on the held-out sequences (teacher forcing)."""
        with _eval_mode(self.model):
            logits = self._logits(self.held_out)
            loss = self._loss(logits, self.held_out).item()
        target = self.held_out.tgt_out
        predicted = logits.data.argmax(axis=-1)
        right = ((predicted == target) | (target == PAD)).all(axis=1)
        return {"val_loss": loss, "exact_match": float(right.mean())}

    def final_evaluate(self):
        """Exact match of greedy decoding on the held-out sequences, plus the loss."""
        predictions = self.model.greedy_decode(self.held_out.src)
        self._predictions = predictions
        return {"val_loss": self.evaluate()["val_loss"],
                "exact_match": data.exact_match(predictions, self.held_out.tgt_out)}

    def _show(self, ids):
        return " ".join(str(s) for s in self.task.decode(ids)) or "(empty)"

    def examples(self, n=3):
        """Lines showing n held-out examples: input, target, greedy prediction."""
        predictions = getattr(self, "_predictions", None)
        if predictions is None or len(predictions) < n:
            predictions = self.model.greedy_decode(self.held_out.src[:n])
        lines = []
        for i in range(min(n, len(self.held_out))):
            target, prediction = self.held_out.tgt_out[i], predictions[i]
            ok = data.sequence_matches([prediction], [target])[0]
            lines += [f"input      {self._show(self.held_out.src[i])}",
                      f"target     {self._show(target)}",
                      f"prediction {self._show(prediction)}  {'(right)' if ok else '(WRONG)'}"]
        return lines

    def _token_names(self, ids):
        return [SPECIAL_NAMES[i] if i in SPECIAL_NAMES else str(i - data.NUM_SPECIAL) for i in ids]

    def attention_example(self):
        """[(name, weights (heads, L, S), key tokens, query tokens, title)] for
        the first held-out sequence, fed with the model's own greedy output."""
        src = self.held_out.src[0]
        src = src[src != PAD]
        prediction = self.model.greedy_decode(src).tolist()
        if EOS in prediction:
            prediction = prediction[:prediction.index(EOS)]
        tgt_in = np.array([BOS] + prediction, dtype=np.int64)
        maps = _record_attention(self.model, lambda: self.model(src[None], tgt_in[None]))
        src_names, tgt_names = self._token_names(src), self._token_names(tgt_in)
        out = []
        for name, weights in maps:
            if name.startswith("encoder"):
                out.append((name, weights, src_names, src_names, f"{name}: source attends to source"))
            elif name.endswith("cross_attn"):
                out.append((name, weights, src_names, tgt_names,
                            f"{name}: decoder input (rows) attends to source (columns)"))
            else:
                out.append((name, weights, tgt_names, tgt_names,
                            f"{name}: decoder input attends to its past (causal)"))
        return out


def _show_char(c):
    """A character as a heatmap label: visible whitespace, one glyph each."""
    return {"\n": "↵", " ": "·", "\t": "→"}.get(c, c)


class CharLMJob:
    """Character-level language modelling with the decoder-only `GPT` (or `Llama`: --arch llama).

    Loss: next-character cross-entropy. Evaluation: the mean loss on
    `eval_size` fixed validation windows (drawn once, from their own seed).
    """

    kind = "charlm"
    EVAL_SEED = 1234    # the validation windows do not depend on the training seed
    EVAL_CHUNK = 64     # windows per forward pass when evaluating
    VAL_FRACTION = 0.1  # the last 10% of the text validates (nanoGPT's split)

    def __init__(self, config):
        self.config = config
        self.text = data.read_text(config.text)
        self._check_length()
        self.data = data.CharLMData(self.text, block_size=config.seq_len, val_fraction=self.VAL_FRACTION,
                                    source=config.text)
        if config.arch == "llama":
            self.model = Llama(LlamaConfig(
                dim=config.d_model, n_layers=config.layers, n_heads=config.heads, n_kv_heads=config.kv_heads,
                vocab_size=self.data.vocab_size, hidden_dim=config.ffn, multiple_of=LLAMA_MULTIPLE_OF,
                max_seq_len=config.seq_len, dropout=config.dropout))
        else:
            self.model = GPT(GPTConfig(
                vocab_size=self.data.vocab_size, block_size=config.seq_len, n_layer=config.layers,
                n_head=config.heads, n_embd=config.d_model, dim_feedforward=config.ffn,
                dropout=config.dropout, bias=config.bias, gelu=config.gelu))
        self.val_x, self.val_y = self.data.get_batch(
            "val", config.eval_size, generator=np.random.default_rng(self.EVAL_SEED))

    def _check_length(self):
        """Both splits need a window of seq-len + 1 characters (CharLMData's rule, in CLI terms)."""
        n, need = len(self.text), self.config.seq_len + 1
        n_train = int(n * (1 - self.VAL_FRACTION))  # as CharLMData splits
        if min(n_train, n - n_train) < need:
            raise ConfigError(f"--text {self.config.text} has {n} characters, too few for --seq-len "
                              f"{self.config.seq_len}: its training part (90%, {n_train} characters) and "
                              f"validation part (10%, {n - n_train}) each need at least seq-len + 1 = "
                              f"{need}; use a longer text or a smaller --seq-len")

    def _text_hash(self):
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def metadata(self):
        """What `sample` needs without the text, and a fingerprint of the text for `resume`."""
        return {"chars": self.data.tokenizer.chars, "text_sha256": self._text_hash()}

    def check_metadata(self, metadata):
        if metadata.get("text_sha256") != self._text_hash():
            raise ConfigError(f"{self.config.text} is not the text this checkpoint was trained on "
                              "(its contents differ); resume needs the same text")

    def train_batch(self, batch_size):
        return self.data.get_batch("train", batch_size)

    @staticmethod
    def num_tokens(batch):
        return batch[1].size

    def loss(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def evaluate(self):
        """{"val_loss"}: mean next-character loss on the validation windows."""
        total = 0.0
        with _eval_mode(self.model):
            for i in range(0, len(self.val_x), self.EVAL_CHUNK):
                x, y = self.val_x[i:i + self.EVAL_CHUNK], self.val_y[i:i + self.EVAL_CHUNK]
                total += self.loss((x, y)).item() * len(x)
        return {"val_loss": total / len(self.val_x)}

    def final_evaluate(self):
        return self.evaluate()

    def prompt(self):
        """A newline (nanoGPT's default prompt) if the text has one, else its first character."""
        return "\n" if "\n" in self.data.tokenizer.chars else self.text[0]

    def examples(self, length=300):
        """Lines of a sample of `length` characters (temperature 0.8, top-k 20),
        drawn from its own seed."""
        ids = self.model.generate(self.data.encode(self.prompt()), length, temperature=0.8, top_k=20,
                                  generator=np.random.default_rng(self.config.seed))
        return ["sample (temperature 0.8, top-k 20):"] + self.data.decode(ids).splitlines()

    def attention_example(self, length=16):
        """[(name, weights (heads, T, T), tokens, tokens, title)] for the first
        `length` characters of the first validation window."""
        x = self.val_x[:1, :length]
        maps = _record_attention(self.model, lambda: self.model(x))
        chars = [_show_char(c) for c in self.data.decode(x[0])]
        return [(name, weights, chars, chars, f"{name}: each character attends to its past (causal)")
                for name, weights in maps]
