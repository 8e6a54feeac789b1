"""Using a trained run: load it for inference, or export it to PyTorch.

    from tinygrad_attn.train import load_run
    model, meta = load_run("runs/charlm")          # a run directory or its checkpoint file
    ids = model.generate(meta.encode("ROMEO:"), 200, temperature=0.8, top_k=20)
    print(meta.decode(ids))

    model, meta = load_run("runs/reverse")
    print(meta.decode(model.greedy_decode(meta.encode([3, 1, 4, 1, 5]))))   # [5, 1, 4, 1, 3]

    export_torch("runs/charlm", "charlm.safetensors")   # for examples/torch_models.py
"""
import json
import os
import re
from dataclasses import asdict, dataclass

from .. import data
from ..checkpoint import save
from ..models import GPT
from .config import TrainConfig
from .checkpoints import checkpoint_file, model_from_checkpoint, read_checkpoint
from .rundir import CHECKPOINT_NAME, RUN_FILES, run_files

TORCH_FORMAT = "tinygrad_attn.torch/1"  # metadata["format"] of an export


@dataclass
class RunInfo:
    """What a trained model needs besides its weights.

    path: the checkpoint file. task: "copy", "reverse", "sort" or "charlm".
    config: the run's TrainConfig. model_config: the model's GPTConfig,
    LlamaConfig or Seq2SeqConfig. step: the training step of the checkpoint.
    tokenizer: ids <-> the task's tokens: a `data.CharTokenizer` for charlm
    (encode(text), decode(ids); its `chars` are the vocabulary), the
    `data.Seq2SeqTask` for copy / reverse / sort (encode(symbols),
    decode(ids), and held-out batches). metadata: the checkpoint's raw
    metadata (strings).
    """

    path: str
    task: str
    config: TrainConfig
    model_config: object
    step: int
    tokenizer: object
    metadata: dict

    def encode(self, tokens):
        """Ids of a text (charlm) or of a list of symbols (seq2seq)."""
        return self.tokenizer.encode(tokens)

    def decode(self, ids):
        """The text (charlm) or the list of symbols up to EOS (seq2seq) of ids."""
        return self.tokenizer.decode(ids)


def load_run(path):
    """(model, RunInfo) of a run directory or checkpoint file: the trained
    model in eval mode, and its vocabulary, task and configuration.
    Raises FileNotFoundError, or CheckpointError for a file that is not a
    training checkpoint of ours."""
    path = checkpoint_file(path)
    arrays, metadata = read_checkpoint(path)
    model = model_from_checkpoint(arrays, metadata)
    config = TrainConfig.from_json(metadata["config"])
    if config.is_seq2seq:
        tokenizer = data.get_task(config.task, num_symbols=config.vocab, length=config.seq_len,
                                  min_length=config.min_seq_len)
    else:
        tokenizer = data.CharTokenizer(metadata["chars"])
    return model, RunInfo(path=path, task=config.task, config=config, model_config=model.config,
                          step=int(metadata["step"]), tokenizer=tokenizer, metadata=metadata)


def run_name(path):
    """The name of the run a checkpoint file belongs to: its directory's name
    (runs/charlm/checkpoint.safetensors -> "charlm"), or the file's own name
    for a checkpoint saved under another name (best.safetensors)."""
    path = os.path.abspath(path)
    if os.path.basename(path) == CHECKPOINT_NAME:
        return os.path.basename(os.path.dirname(path))
    return os.path.basename(path)


def check_not_run_files(path, *targets):
    """Raise ValueError if a file an export would write (`targets`) is the
    checkpoint of the run at `path` (a directory or checkpoint file), under
    any name (a symbolic or hard link), or one of the files of the run's
    directory (`rundir.RUN_FILES`, existing or not, and its heatmaps):
    sample and resume read them, and --overwrite must not destroy them."""
    checkpoint = checkpoint_file(path)
    directory = os.path.dirname(os.path.abspath(checkpoint))
    protected = [checkpoint] + [os.path.join(directory, name) for name in RUN_FILES] + run_files(directory)
    resolved = {os.path.realpath(p) for p in protected}
    existing = [p for p in protected if os.path.exists(p)]
    for target in targets:
        target = os.fspath(target)
        exists = os.path.exists(target)
        if os.path.realpath(target) in resolved or (exists and any(os.path.samefile(target, p) for p in existing)):
            what = "the checkpoint" if exists and os.path.samefile(target, checkpoint) else "a file"
            raise ValueError(f"{target} is {what} of the run in {directory}, which sample and resume need; "
                             "export elsewhere (--overwrite never replaces a run's own files)")


# --------------------------------------------------------------------------- PyTorch
# our GPT's parameter names -> nanoGPT's (examples/torch_models.py's GPT)
_NANOGPT_NAMES = [
    (r"tok_emb\.weight", "transformer.wte.weight"),
    (r"pos_emb\.weight", "transformer.wpe.weight"),
    (r"transformer\.layers\.(\d+)\.norm1\.", r"transformer.h.\1.ln_1."),
    (r"transformer\.layers\.(\d+)\.norm2\.", r"transformer.h.\1.ln_2."),
    (r"transformer\.layers\.(\d+)\.self_attn\.in_proj_weight", r"transformer.h.\1.attn.c_attn.weight"),
    (r"transformer\.layers\.(\d+)\.self_attn\.in_proj_bias", r"transformer.h.\1.attn.c_attn.bias"),
    (r"transformer\.layers\.(\d+)\.self_attn\.out_proj\.", r"transformer.h.\1.attn.c_proj."),
    (r"transformer\.layers\.(\d+)\.linear1\.", r"transformer.h.\1.mlp.c_fc."),
    (r"transformer\.layers\.(\d+)\.linear2\.", r"transformer.h.\1.mlp.c_proj."),
    (r"transformer\.norm\.", "transformer.ln_f."),
    (r"lm_head\.weight", "lm_head.weight"),
]


def _nanogpt_name(name):
    for pattern, replacement in _NANOGPT_NAMES:
        new, count = re.subn("^" + pattern, replacement, name)
        if count:
            return new
    raise KeyError(f"torch_state_dict: no nanoGPT name for the GPT parameter {name!r}")


def torch_state_dict(model):
    """{name: float32 numpy array} with the parameter names of the PyTorch
    module of examples/torch_models.py: nanoGPT's for a GPT, ours (which
    are torch.nn.Transformer's) for a Seq2SeqTransformer, ours (which are
    llama2.c's) for a Llama. A tied weight appears under both names, as in
    PyTorch's state_dict."""
    state = {name: t.data for name, t in model.state_dict().items()}
    if isinstance(model, GPT):
        state = {_nanogpt_name(name): array for name, array in state.items()}
    return state


def export_torch(path, out, overwrite=False):
    """Write the model of a run (directory or checkpoint) as a safetensors
    state dict for PyTorch (`torch_state_dict`), with metadata "module"
    (GPT, Llama or Seq2SeqTransformer), "config" (its constructor's arguments, JSON),
    "task", "step", "source" (the run's name, `run_name`: never a local path,
    as the file is made to be shared) and "format". Refuses an existing
    `out` unless overwrite=True, and always a file of the run itself
    (`check_not_run_files`). Returns `out`."""
    out = os.fspath(out)
    check_not_run_files(path, out)
    if os.path.isdir(out):
        raise IsADirectoryError(f"{out} is a directory; give the file to write, e.g. {out}/model.safetensors")
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it")
    model, info = load_run(path)
    config = asdict(model.config)
    metadata = {"format": TORCH_FORMAT, "module": type(model).__name__, "config": json.dumps(config),
                "task": info.task, "step": str(info.step), "source": run_name(info.path)}
    if "chars" in info.metadata:
        metadata["chars"] = info.metadata["chars"]
    save(torch_state_dict(model), out, metadata=metadata)
    return out
