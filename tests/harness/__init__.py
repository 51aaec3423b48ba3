"""The suite's harness, what the tests import (tests/conftest.py holds only fixtures and hooks):

- paths: where things are (the repository, this venv's commands, rig's cache, the stacks and locks the tests use);
- commands: a command on this machine, rig's own CLI, and the check that one succeeded;
- images: rig's images in the Docker store (a script in one, pruning a lock's old builds);
- boxes: a box, a container standing for a GPU machine (started, run in, removed);
- plays: ansible-playbook against boxes, its results as the suite's callback writes them;
- play_log: where the box tests' time goes ($RIG_PLAY_LOG);
- lab: real venvs built once per run and shared by the pytest-xdist workers;
- standin: the SGLang stand-in server (tests/sglang_api_server.py), a venv of it and its cases;
- tune: `rig tune` against the stand-in, as the tune tests run it;
- venvs: a real venv of a lock made here (rig's marker and hook), its site-packages, a module's bytecode path,
  a file with one byte changed;
- venv_images: a venv packed and imaged here, three locks' images, an image's name and a stack's environment;
- venv_takes: what the venv-image box tests look for on a box (the venv, its Python, the role's task names);
- tars: tar archives laid out by hand (a header, a padded member, one tarfile cannot read) and zstd of bytes;
- elf: CUDA device code laid out by hand (a CUDA ELF, fat binaries and their entries, a section added to an object);
- toolkits: CUDA toolkit trees whose nvcc, headers and libcudart say the releases asked for;
- rig_action: the rig action plugin loaded as a module, and ansible-playbook runs of it on this controller;
- os_faults: a filesystem call made to fail at one path (what rig must leave nothing behind after);
- worker_groups: which box tests share a pytest-xdist worker, and in what order the workers take them.
"""
