"""Hints that send the user to a command, written once: every error that needs the thing says the same way to make
it, and tests/unit/test_hints.py runs each command a hint names in a checkout with no venv, where none may refuse
for a reason the hint does not name (a hint that sent the user to a command which first wants another is a circle).
"""

# the stack's venv, wherever a command needs one and none is there
CREATE_VENV = ("create it with `rig wheelhouse fetch LOCK`, `rig wheelhouse export LOCK DIR` and "
               "`rig venv install --lock LOCK --wheelhouse DIR` (LOCK: the stack's lock, beside it), or let the "
               "python_stack role make it (`make provision` runs it in the box)")
