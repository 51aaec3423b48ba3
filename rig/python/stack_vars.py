"""A stack's Ansible role variables: its CUDA settings, and where it pins packages, its lock per Python and
the runtime environment, so that playbooks take versions from one place (`rig stack vars`)."""
from __future__ import annotations

from pathlib import Path

from rig.python.lock import variants
from rig.python.runtime_env import environment
from rig.stack.spec import pins_packages


def ansible_vars(stack: dict, path: str | Path | None = None) -> dict:
    """The role variables a stack implies, so playbooks take versions from one place."""
    cuda = stack["cuda"]
    python = {}
    if path is not None and pins_packages(stack):
        python = {"python_stack_lock": str(Path(path).resolve().with_suffix(".lock")),
                  "python_stack_locks": {py: str(lock) for py, _, lock in variants(stack, path)},
                  "python_stack_venv": stack["venv"],
                  "python_stack_environment": {**environment(stack), "stack": stack["name"]},
                  # the patches sglang_patches applies after python_stack: the archive and image carry them
                  "python_stack_patches": {"opt_in": stack["patches"]["opt_in"]}}
    return {**python,
        "rig_stack_data": stack,
        "rig_stack_name": stack["name"],
        "rig_archs": stack["archs"],
        "sglang_patches_opt_in": stack["patches"]["opt_in"],
        "cuda_toolkit_version": cuda["version"],
        "cuda_toolkit_method": cuda["method"],
        "cuda_toolkit_components": cuda["components"],
        "cuda_toolkit_make_default": cuda["make_default"],
        "cuda_toolkit_apt_repo_url": cuda["apt"]["repo_url"],
        "cuda_toolkit_apt_keyring_url": cuda["apt"]["keyring_url"],
        "cuda_toolkit_apt_package": cuda["apt"]["package"],
        "cuda_toolkit_runfile_url": cuda["runfile"]["url"],
        "cuda_toolkit_runfile_sha256": cuda["runfile"]["sha256"],
    }
