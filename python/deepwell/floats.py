"""floats.py — float activations in and out of a feed-forward engine (Engine.forward_float): the
caller's NumPy array or torch tensor [..., C_in] checked and folded into FP32 rows (N, C_in), and
the rows (N, C_out) unfolded back into the caller's type, dtype and leading shape."""
import numpy as np


def float_rows(x, c_in, c_out):
    """(rows (N, c_in) float32 C-contiguous, back(out (N, c_out) float32) -> x's kind [..., c_out])."""
    is_torch = hasattr(x, "detach") and hasattr(x, "dtype") and hasattr(x, "is_floating_point")
    if is_torch:
        if not x.is_floating_point():
            raise TypeError(f"the model takes float activations, got a torch tensor of {x.dtype}")
        dtype, device = x.dtype, x.device
        a = x.detach().cpu().float().numpy()
    else:
        a = np.asarray(x)
        if a.dtype.kind != "f":
            raise TypeError(f"the model takes float activations, got an array of {a.dtype}")
        dtype = a.dtype
    if a.ndim < 1 or a.shape[-1] != c_in:
        raise ValueError(f"the model takes [..., {c_in}] features, got shape {tuple(a.shape)}")
    lead = a.shape[:-1]
    rows = np.ascontiguousarray(a.reshape(-1, c_in), dtype=np.float32)
    if rows.shape[0] == 0:
        raise ValueError(f"the input has no rows (shape {tuple(a.shape)})")

    def back(out):
        out = out.reshape(*lead, c_out)
        if is_torch:
            import torch

            return torch.from_numpy(out).to(device=device, dtype=dtype)
        return out.astype(dtype, copy=False)

    return rows, back
