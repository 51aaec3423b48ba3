"""What the venv-image box tests look for on a box: the venv's path, a command that runs its Python, and the
python_stack role's task names for each way the venv is taken (mounted, unpacked, installed from wheels)."""
VENV = "/opt/rig/venv"
CLICK = f"{VENV}/bin/python -c 'import click; print(click.__version__)'"
MOUNT = "Mount the lock's venv image read-only at the venv, pulled and checked"
UNPACK = "Unpack the archive into the venv, pulled and checked while it streams"
WHEELS = "Install the lock into the venv, pulling its wheels"
