"""torch_capture.py — PyTorch modules -> a model directory the library captures: config.json
and model.safetensors in Hugging Face names and layouts.

Recognised: a transformers PreTrainedModel (or any module like one: a `config` with to_dict()
and a model_type, and a state_dict() in that architecture's Hugging Face names) whose model_type
the library trains (SUPPORTED); a module without such a config goes to fx_capture (GPT-2 and
Llama decoders read from their torch.fx graph). Anything else is refused with a message naming
what is supported.
"""
import json
import os

from . import safetensors

# model_type values whose training graph capture builds (src/capture/archs.def, trains = 1).
SUPPORTED = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "mixtral", "olmoe", "qwen2_moe",
             "qwen3_moe")


def _config_dict(module):
    cfg = getattr(module, "config", None)
    if cfg is None:
        return None
    if isinstance(cfg, dict):
        return dict(cfg)
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    return None


def refuse(module, why):
    raise TypeError(
        f"dw.capture: cannot capture {type(module).__module__}.{type(module).__name__}: {why}. Supported: a "
        f"preset name, a Hugging Face model directory or config.json path, a config dict, or a transformers "
        f"PreTrainedModel (a module with .config.to_dict() and .state_dict() in Hugging Face names) of "
        f"model_type {', '.join(SUPPORTED)}, or a plain torch.nn.Module that torch.fx reads as a GPT-2 or Llama "
        f"decoder (docs/python.md)")


def write_model_dir(module, out, seq_len=None):
    """Writes out/config.json and out/model.safetensors for a recognised module."""
    if not hasattr(module, "state_dict"):
        refuse(module, "it is not a torch.nn.Module")
    cfg = _config_dict(module)
    if cfg is None:  # a plain module: read its structure through torch.fx
        from . import fx_capture

        try:
            fx_capture.write_model_dir(module, out, seq_len)
        except fx_capture.CaptureError as e:
            refuse(module, str(e))
        return
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        refuse(module, f"its config's model_type is {mt!r}")
    cfg = {k: v for k, v in cfg.items() if _jsonable(v)}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    # every floating tensor under its own name: the library ignores a tied LM head and the
    # architecture's known buffers (archs.def), and refuses anything else it does not expect
    tensors = {n: t for n, t in module.state_dict().items() if t.is_floating_point()}
    safetensors.write(os.path.join(out, "model.safetensors"), tensors)


def _jsonable(v):
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
