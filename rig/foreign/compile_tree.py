"""Byte-compile a venv's modules with every core, run by rig.python.venv in that venv's Python after pip (which
compiles one file after another). A module that does not compile is skipped, as pip skips it: the exit status
says nothing about those."""
import compileall
import sys

if __name__ == "__main__":
    compileall.compile_dir(sys.argv[1], quiet=2, workers=0)
