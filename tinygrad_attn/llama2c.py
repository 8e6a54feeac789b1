"""llama2.c's files: a `Llama` and its character vocabulary for llama2.c's run.c.

    python -m tinygrad_attn export runs/charlm-llama --to llama2c charlm.bin
    ./run charlm.bin -z charlm.tokenizer.bin -t 0        # in a llama2.c checkout, greedy

The model file is the legacy ("version 0") layout of llama2.c's export.py,
the one run.c reads: a header of seven int32 (dim, hidden_dim, n_layers,
n_heads, n_kv_heads, vocab_size, max_seq_len; a negative vocab_size means
the output layer is not tied to the token embedding and follows at the
end), then float32 arrays in C order, each group over all layers before
the next: tok_embeddings (vocab, dim); attention_norm; wq; wk; wv; wo;
ffn_norm; w1; w2; w3 (each weight (out, in), as nn.Linear); the final
norm; freqs_cos and freqs_sin (max_seq_len, head_dim / 2), which run.c
skips (it recomputes the angles); [output (vocab, dim) if untied].

The tokenizer file: int32 max_token_length, then per id a float32 merge
score, an int32 byte length and the UTF-8 bytes of its piece.

What run.c's tokenizer conventions mean for a character vocabulary:
- id 1 is BOS: generation starts from it, and stops when it is sampled.
  A character model has no BOS, so the export reorders the ids to put the
  newline at id 1 (swapping it with the character there; the embedding
  rows move with their ids, the model is the same): run.c then starts from
  a newline, as our sampler does (`CharLMJob.prompt`, nanoGPT's default),
  and stops at the end of the line. A text without a newline keeps its
  second character at id 1.
- with a prompt (-i), encode() inserts the piece " " after BOS (the
  SentencePiece dummy prefix): the model reads newline, space, prompt.
  Without a space in the vocabulary, run.c would look up id -1: the export
  refuses such a vocabulary.
- decode() drops the leading space of the piece that follows BOS, so a
  space generated right after the first newline is not printed.
- the BPE merge loop merges two pieces whose concatenation is a piece;
  single characters never are, so it merges nothing. Characters outside
  the vocabulary fall back to ids byte + 3 (meant for Llama's <0x..> byte
  pieces at ids 3..258): meaningless here, so give prompts from the text's
  characters only. Pieces like "<0x0A>" (a byte) cannot occur: each piece
  is one character. A NUL character cannot be a piece (C strings).
- run.c fixes eps = 1e-5 and theta = 10000 (rotary): the export checks
  the model's norm_eps.
- id 2 is EOS only in run.c's chat mode (-m chat); generate mode ignores it.

`read_model` and `read_tokenizer` read both files back (tests/test_llama2c.py).
"""
import os
import struct

import numpy as np

from .checkpoint import write_files

HEADER = struct.Struct("<7i")
HEADER_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len")
RUN_C_EPS = 1e-5  # run.c's rmsnorm: ss += 1e-5f
BOS = 1  # run.c: the id that starts every generation and stops it when sampled


def llama2c_ids(chars):
    """The order of our ids in the exported files: export id i holds our id order[i].
    The newline moves to id 1 (BOS), swapping with the character there."""
    order = list(range(len(chars)))
    if "\n" in chars and len(chars) > BOS:
        newline = chars.index("\n")
        order[BOS], order[newline] = order[newline], order[BOS]
    return np.array(order)


def _layer_groups(model):
    """The per-layer arrays in export.py's order, each group over all layers."""
    names = [("attention_norm", None), ("attention", "wq"), ("attention", "wk"), ("attention", "wv"),
             ("attention", "wo"), ("ffn_norm", None), ("feed_forward", "w1"), ("feed_forward", "w2"),
             ("feed_forward", "w3")]
    groups = []
    for part, sub in names:
        arrays = []
        for layer in model.layers:
            module = getattr(layer, part)
            arrays.append((getattr(module, sub) if sub else module).weight.data)
        groups.append((f"{part}.{sub}" if sub else part, arrays))
    return groups


def _check_model(model):
    if type(model).__name__ != "Llama":
        raise TypeError(f"llama2c export: llama2.c runs Llama models; this is a {type(model).__name__} "
                        "(train with --arch llama)")
    if abs(model.config.norm_eps - RUN_C_EPS) > 1e-12:
        raise ValueError(f"llama2c export: run.c computes RMSNorm with eps = 1e-5; this model has "
                         f"norm_eps = {model.config.norm_eps}")


def _pieces(chars, order):
    pieces = [chars[i].encode("utf-8") for i in order]
    if b"\0" in pieces:
        raise ValueError("llama2c export: the vocabulary holds a NUL character, which run.c's C strings "
                         "cannot hold")
    if b" " not in pieces:
        raise ValueError("llama2c export: the vocabulary has no space, which run.c's encode() inserts "
                         "after BOS (the dummy prefix)")
    return pieces


def _model_bytes(model, order=None):
    """The chunks of bytes of write_model's file (checked before any is made)."""
    c = model.config
    _check_model(model)
    order = np.arange(c.vocab_size) if order is None else np.asarray(order)
    embedding = model.tok_embeddings.weight.data[order]
    shared = model.output.weight is model.tok_embeddings.weight
    attention = model.layers[0].attention
    hidden_dim = model.layers[0].feed_forward.w1.weight.shape[0]
    header = HEADER.pack(c.dim, hidden_dim, c.n_layers, c.n_heads, attention.n_kv_heads,
                         c.vocab_size if shared else -c.vocab_size, c.max_seq_len)
    arrays = [embedding] + [a for _, group in _layer_groups(model) for a in group]
    arrays += [model.norm.weight.data, model.freqs_cos.data[:c.max_seq_len], model.freqs_sin.data[:c.max_seq_len]]
    if not shared:
        arrays.append(model.output.weight.data[order])
    return [header] + [np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrays]


def _tokenizer_bytes(chars, order=None):
    """The chunks of bytes of write_tokenizer's file (checked before any is made)."""
    pieces = _pieces(chars, range(len(chars)) if order is None else order)
    return [struct.pack("<i", max(len(p) for p in pieces))] + [
        struct.pack("<fi", 0.0, len(piece)) + piece for piece in pieces]


def write_model(model, path, order=None):
    """Write a `Llama` in llama2.c's version-0 layout; `order` reorders the vocabulary
    (export id i = model id order[i]; default: unchanged). Returns the byte count.
    As `checkpoint.save`, through a temporary file renamed over `path`: an
    error or an interrupt leaves any earlier file at `path` intact."""
    write_files({path: _model_bytes(model, order)}, "llama2c export")
    return os.path.getsize(path)


def write_tokenizer(chars, path, order=None):
    """Write the tokenizer file of a character vocabulary (export id i = character
    chars[order[i]]): every merge score 0 (no piece is a concatenation of two).
    Through a temporary file, as write_model."""
    write_files({path: _tokenizer_bytes(chars, order)}, "llama2c export")


def read_model(path):
    """(header dict, {name: float32 array}) of a version-0 model file; the names
    are write_model's groups ("tok_embeddings", "attention.wq", ..., "freqs_sin",
    "output"), each stacked over the layers; header["shared"] tells whether
    the output is the embedding."""
    with open(path, "rb") as f:
        raw = f.read()
    header = dict(zip(HEADER_FIELDS, HEADER.unpack_from(raw)))
    header["shared"] = header["vocab_size"] > 0
    header["vocab_size"] = V = abs(header["vocab_size"])
    d, L, hd = header["dim"], header["n_layers"], header["dim"] // header["n_heads"]
    kv, h, T = header["n_kv_heads"] * hd, header["hidden_dim"], header["max_seq_len"]
    shapes = [("tok_embeddings", (V, d)), ("attention_norm", (L, d)), ("attention.wq", (L, d, d)),
              ("attention.wk", (L, kv, d)), ("attention.wv", (L, kv, d)), ("attention.wo", (L, d, d)),
              ("ffn_norm", (L, d)), ("feed_forward.w1", (L, h, d)), ("feed_forward.w2", (L, d, h)),
              ("feed_forward.w3", (L, h, d)), ("norm", (d,)), ("freqs_cos", (T, hd // 2)), ("freqs_sin", (T, hd // 2))]
    if not header["shared"]:
        shapes.append(("output", (V, d)))
    floats = np.frombuffer(raw, dtype="<f4", offset=HEADER.size)
    arrays, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        if at + n > floats.size:
            raise ValueError(f"{path}: the file ends inside {name} (a truncated or different layout)")
        arrays[name] = floats[at:at + n].reshape(shape)
        at += n
    if at != floats.size:
        raise ValueError(f"{path}: {4 * (floats.size - at)} bytes after the last array (another layout?)")
    return header, arrays


def read_tokenizer(path, vocab_size):
    """(max_token_length, [(score, piece bytes)] for ids 0..vocab_size-1), as run.c reads it."""
    with open(path, "rb") as f:
        raw = f.read()
    (max_len,), at, pieces = struct.unpack_from("<i", raw), 4, []
    for _ in range(vocab_size):
        score, n = struct.unpack_from("<fi", raw, at)
        at += 8
        pieces.append((score, raw[at:at + n]))
        at += n
    if at != len(raw):
        raise ValueError(f"{path}: {len(raw) - at} bytes after the last of {vocab_size} pieces")
    return max_len, pieces


def export(model, chars, model_path, tokenizer_path):
    """Write the model and tokenizer files of a charlm `Llama` with vocabulary
    `chars` (the newline at id 1, see the module docstring); returns the order
    of ids used (export id i = our id order[i]). Both files are written to
    temporary files first and renamed over their paths only when both are
    whole: an error leaves the earlier files (if any) as they were."""
    order = llama2c_ids(chars)
    # both files or neither: both written to temporary files, then both renamed
    write_files({model_path: _model_bytes(model, order), tokenizer_path: _tokenizer_bytes(chars, order)},
                "llama2c export")
    return order


def tokenizer_path_for(model_path):
    """charlm.bin -> charlm.tokenizer.bin: the tokenizer file beside the model file."""
    root, ext = os.path.splitext(os.fspath(model_path))
    return f"{root}.tokenizer{ext or '.bin'}"


def export_run(path, out, overwrite=False):
    """Write the Llama of a run (directory or checkpoint) as `out` and its
    tokenizer beside it (`tokenizer_path_for`); refuses existing files unless
    overwrite=True, and always the files of the run itself
    (`train.run.check_not_run_files`). Returns (model file, tokenizer file)."""
    from .train.run import check_not_run_files, load_run
    out = os.fspath(out)
    tokenizer = tokenizer_path_for(out)
    check_not_run_files(path, out, tokenizer)
    for target in (out, tokenizer):
        if os.path.isdir(target):
            raise IsADirectoryError(f"{target} is a directory; give the file to write, e.g. {target}/model.bin")
        if os.path.exists(target) and not overwrite:
            raise FileExistsError(f"{target} already exists; pass --overwrite to replace it")
    model, info = load_run(path)
    if info.task != "charlm":
        raise TypeError(f"llama2c export: llama2.c runs language models; {path} is a {info.task} run")
    export(model, info.tokenizer.chars, out, tokenizer)
    return out, tokenizer
