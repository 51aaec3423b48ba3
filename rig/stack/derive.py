"""Stacks derived from a stack: a copy with some server keys changed, for a server rig starts itself (a variant
tune or prove measures). The stack as read is never changed."""
from __future__ import annotations

import copy
from typing import Any

from rig.core import RigError
from rig.stack.spec import GRAPH_MAX


def with_server(stack: dict, **server: Any) -> dict:
    """A copy of STACK whose server section has SERVER's keys instead: a variant rig starts itself."""
    derived = copy.deepcopy(stack)
    derived["server"].update(server)
    return derived


def sized_for(stack: dict, levels: list[int]) -> dict:
    """STACK with its decode CUDA graph given explicitly for measuring at LEVELS (concurrencies): its own
    server.cuda_graph_max_bs, or the largest level where it gives none; below that level batches would run without
    CUDA graphs and measure something else."""
    given, largest = stack["server"]["cuda_graph_max_bs"], max(levels)
    if largest > GRAPH_MAX:
        raise RigError(f"concurrency {largest} is above the largest decode CUDA graph a stack may ask for "
                       f"({GRAPH_MAX}): batches above it would run without CUDA graphs; measure at {GRAPH_MAX} or less")
    if given and given < largest:
        raise RigError(f"server.cuda_graph_max_bs {given} is below the largest concurrency measured, {largest}: "
                       "batches above it would run without CUDA graphs; raise it, leave it 0, or measure lower")
    return with_server(stack, cuda_graph_max_bs=given or largest)
