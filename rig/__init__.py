"""rig: provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13.

The subpackages follow the steps, each importing only those before it (tests/unit/test_layers.py):
core, engine, stack, python, cuda, kernels, patches, machine, serving, image, ci, cli.
"""

__version__ = "0.1.0"

# The layers in order, the one list that tests/unit/test_layers.py holds the imports to and that
# scripts/readme_tables.py renders README.md's layer table from. rig.foreign is no layer: no rig module imports it.
LAYERS = ("core", "engine", "stack", "python", "cuda", "kernels", "patches", "machine", "serving", "image", "ci",
          "cli")
