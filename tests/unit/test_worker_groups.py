"""The box run's scheduler (tests/harness/worker_groups.py GroupScheduling) with workers that only note what they
are sent: each group stays on one worker, the groups go in collection order, the next to a worker down to its last
two tests, and a crashed worker's other tests to another."""
from types import SimpleNamespace

from harness.worker_groups import GroupScheduling

SITE = "test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet"
IDS = [f"tests/integration/{name}" for name in (
    f"test_python_stack.py::{SITE}", "test_image.py::test_a", "test_image_builder.py::test_b",
    "test_upgrade.py::test_c[1]", "test_upgrade.py::test_c[2]", "test_upgrade.py::test_d",
    "test_cuda_toolkit.py::test_e", "test_role_scenarios.py::test_f")]


class Worker:
    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def scheduled(workers: int):
    sched = GroupScheduling(SimpleNamespace(getvalue={"tx": [f"{workers}*popen"]}.get))
    nodes = [Worker(f"gw{n}") for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
        assert not sched.collection_is_completed
        sched.add_node_collection(node, IDS)
    assert sched.collection_is_completed
    sched.schedule()
    return sched, nodes


def test_a_group_goes_to_one_worker_and_the_next_to_the_first_down_to_two_tests():
    sched, (first, second) = scheduled(2)
    assert (first.sent, second.sent) == ([0, 1, 2], [3, 4, 5])  # whole-stacks, site test first; test_upgrade
    sched.mark_test_complete(second, 3)
    assert second.sent == [3, 4, 5, 6] and first.sent == [0, 1, 2]
    sched.mark_test_complete(second, 4)
    assert second.sent == [3, 4, 5, 6, 7] and not second.shutting_down
    sched.mark_test_complete(second, 5)
    assert second.shutting_down and not first.shutting_down  # none left: it runs its last two tests and stops
    sched.mark_test_complete(first, 0)
    assert first.shutting_down and sched.has_pending and not sched.tests_finished
    sched.mark_test_complete(second, 6)
    sched.mark_test_complete(first, 1)
    assert sched.tests_finished  # no worker holds more than the test it is running
    for node, index in ((first, 2), (second, 7)):
        sched.mark_test_complete(node, index)
    assert not sched.has_pending
    assert sched.remove_node(first) is None and sched.remove_node(second) is None


def test_a_crashed_workers_other_tests_go_to_the_next_worker_that_is_free():
    sched, (first, second) = scheduled(2)
    assert sched.remove_node(second) == IDS[3]  # the test it was running, reported as its crash
    assert first.sent == [0, 1, 2]
    sched.mark_test_complete(first, 0)
    assert first.sent == [0, 1, 2, 4, 5]


def test_workers_beyond_the_groups_are_told_to_stop():
    sched, nodes = scheduled(8)
    assert [n.sent for n in nodes[:5]] == [[0, 1, 2], [3, 4, 5], [6], [7], []]
    assert [n.shutting_down for n in nodes] == [False, False, True, True] + [True] * 4
