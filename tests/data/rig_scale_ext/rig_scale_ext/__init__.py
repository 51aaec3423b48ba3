"""rig's test extension: scale_add(x, y, alpha) = alpha * x + y, a torch operator its library registers."""
import torch

from . import _C  # noqa: F401  (loading the library registers torch.ops.rig_scale_ext)

scale_add = torch.ops.rig_scale_ext.scale_add
