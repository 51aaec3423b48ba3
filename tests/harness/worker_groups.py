"""Which box tests share a pytest-xdist worker, and in what order the workers take them.

Under `-n N --dist loadscope` (make test's box run) tests/conftest.py schedules with GroupScheduling below: it
keeps on one worker each module's tests (they share its module-scoped boxes and images), and puts some modules
together:
- the three that each hold a whole stack on disk (the default stack's 11.7 GB image; the source-build
  image with its builder stage; a box converged with the default stack, about 10 GB: test_python_stack's
  site test alone, its small stacks' tests go beside) run one after the other: beside the lab's 11 GB venv
  and the caches, any two together filled the disk of a CI machine (the chain is the box run's longest path);
- the modules that use the lab, in two groups of about equal length.

pytest-xdist's own `--dist loadgroup` (xdist_group marks) cannot, as of pytest 9.2 and pytest-xdist 3.8.0: its
workers write the group into a test's id (item._nodeid), which pytest 9.2 no longer reads (an item's nodeid
comes from its structured id), so every test goes alone (pytest-dev/pytest-xdist#1386). GroupScheduling is a
scheduler of the suite's own, through xdist's public hook (pytest_xdist_make_scheduler) and scheduler
interface (xdist.scheduler.Scheduling); the controller sees only the tests' ids, so groups go by name.
"""
from __future__ import annotations

from collections.abc import Sequence

import pytest
from xdist.report import report_collection_diff
from xdist.workermanage import WorkerController, parse_tx_spec_config

GROUPS = {"test_image": "whole-stacks", "test_image_builder": "whole-stacks",
          "test_python_stack::test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet": "whole-stacks",
          "test_patches": "lab-1", "test_server_args": "lab-1", "test_testmodel": "lab-1", "test_validate": "lab-1",
          "test_prove": "lab-2", "test_wheels": "lab-2", "test_runbooks": "lab-2"}

# Each worker takes a group, and the next group in this order goes to whichever worker is down to its last two
# tests (a worker runs a test only once it holds the one after it): the longest groups first.
# The quick run's first (its modules hold no box test): the tests that wait on modelled servers, whose wall time
# the other tests' CPU fills.
FIRST = ("test_tune", "test_smoke_bench",
         "whole-stacks", "lab-1", "lab-2", "test_upgrade", "test_bare_metal", "test_rollout", "test_upgrade_stack",
         "test_cuda_toolkit", "test_role_scenarios")
# Each of these first in its group: the whole-stacks chain's last two tests were the site test (10 min) and
# another, so a group given at their start (Molecule's, 6 min) ran after them, the box run's last (37.8 min;
# with the site test first, the chain's last two tests take seconds and come after the queue is empty). The
# site test also leaves the default lock's venv archive in the controller's cache, which the default image's
# build then unpacks instead of installing the wheels again.
# The quick run's longest test (its stand-ins' modelled time, 106 s) came 84 s into a 200 s run and ended it.
LEADS = ("test_python_stack::test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet",
         "test_tune::test_free_offs_plain_step_0_is_measured_beside_sglangs_and_the_policy_runs_on_it")


def node_name(nodeid: str) -> str:
    """module::test of NODEID, without its parameters."""
    path, _, name = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1].removesuffix('.py')}::{name.split('[')[0]}"


def worker_group(nodeid: str) -> str:
    """The group of NODEID's test (by module::test, else by module), else its module."""
    name = node_name(nodeid)
    module = name.split("::")[0]
    return GROUPS.get(name, GROUPS.get(module, module))


def collection_rank(nodeid: str) -> tuple[int, bool]:
    """Where NODEID's test goes in the collection (sorted stably by this): FIRST's groups in turn, the other
    groups after them, a group's lead before the rest. The workers take the groups in that order."""
    group = worker_group(nodeid)
    return FIRST.index(group) if group in FIRST else len(FIRST), node_name(nodeid) not in LEADS


class GroupScheduling:
    """Each group's tests (worker_group) to one worker, the groups in collection order: a group to each worker at
    the start, then the next to a worker as it is down to its last two tests; a worker that finds none left is
    told to shut down (it runs its last test then). A worker that crashes has the rest of its tests given to
    another as a group of their own."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        self.config = config
        self.numnodes = len(parse_tx_spec_config(config))
        self.collections: dict[WorkerController, list[str]] = {}
        self.pending: dict[WorkerController, list[str]] = {}  # each worker's tests given and not yet reported
        self.queue: list[list[str]] | None = None  # the groups not yet given, in order; None until scheduled

    @property
    def nodes(self) -> list[WorkerController]:
        return list(self.pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        return self.queue == [] and all(len(tests) < 2 for tests in self.pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.queue) or any(self.pending.values())

    def add_node(self, node: WorkerController) -> None:
        self.pending[node] = []

    def add_node_collection(self, node: WorkerController, collection: Sequence[str]) -> None:
        self.collections[node] = list(collection)

    def schedule(self) -> None:
        if self.queue is None:
            self.queue = self._groups()
            for node in self.nodes:
                self._give(node)
        for node in self.nodes:
            self._feed(node)

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        self.pending[node].remove(self.collections[node][item_index])
        self._feed(node)

    def remove_node(self, node: WorkerController) -> str | None:
        """NODE gone (done, or crashed): the test it was running when it crashed, or None."""
        tests = self.pending.pop(node)
        if not tests:
            return None
        assert self.queue is not None
        if tests[1:]:
            self.queue.insert(0, tests[1:])
        for other in self.nodes:
            self._feed(other)
        return tests[0]

    def mark_test_pending(self, item: str) -> None:
        raise NotImplementedError  # no tests are taken back from a worker (only --dist worksteal does)

    def remove_pending_tests_from_node(self, node: WorkerController, indices: Sequence[int]) -> None:
        raise NotImplementedError

    def _groups(self) -> list[list[str]]:
        """The workers' collection in groups, in order of each group's first test; none if two workers
        collected differently (reported as a collection error, as xdist's schedulers do)."""
        (first, ids), *others = self.collections.items()
        for node, collected in others:
            diff = report_collection_diff(ids, collected, first.gateway.id, node.gateway.id)
            if diff:
                self.config.hook.pytest_collectreport(report=pytest.CollectReport(
                    nodeid=node.gateway.id, outcome="failed", longrepr=diff, result=[]))
                return []
        groups: dict[str, list[str]] = {}
        for nodeid in ids:
            groups.setdefault(worker_group(nodeid), []).append(nodeid)
        return list(groups.values())

    def _give(self, node: WorkerController) -> None:
        """The next group to NODE, or, with none left, NODE told to shut down."""
        assert self.queue is not None
        if not self.queue:
            node.shutdown()
            return
        tests = self.queue.pop(0)
        self.pending[node] += tests
        node.send_runtest_some([self.collections[node].index(nodeid) for nodeid in tests])

    def _feed(self, node: WorkerController) -> None:
        """The next group to NODE if it is down to its last two tests (see FIRST)."""
        if not node.shutting_down and len(self.pending[node]) <= 2:
            self._give(node)
