"""The crossover rule on synthetic noisy results: a level is won or lost only when every round agrees."""
from rig.serving.measure.verdict import crossover


def run(levels: dict[int, list[float]]) -> dict:
    return {"levels": [{"max_concurrency": c, "round_output_throughput": t, "output_throughput": sorted(t)[len(t) // 2]}
                       for c, t in levels.items()]}


def test_noise_cannot_move_the_crossover():
    # the run: EAGLE-3 "lost" at 2 (0.93) and "won" again at 4 and 8 -- by one round each
    eagle = run({1: [150, 152, 149], 2: [260, 300, 290], 4: [520, 470, 505], 8: [900, 980, 950], 16: [1200, 1210, 1190]})
    base = run({1: [100, 101, 99], 2: [280, 250, 270], 4: [500, 500, 510], 8: [940, 930, 960], 16: [1700, 1680, 1710]})
    x = crossover(eagle, base)
    assert [r["verdict"] for r in x["levels"]] == ["won", "within noise", "within noise", "within noise", "lost"]
    assert x["highest_winning_concurrency"] == 1
    assert x["within_noise"] == [2, 4, 8] and x["wins_after_a_loss"] == []
    assert "up to concurrency 1; within noise at C=2, 4, 8; it loses at C=16" in x["recommendation"]
    two = x["levels"][1]
    assert two["ratio_min"] < 1 < two["ratio_max"] and two["rounds"] == 3


def test_clear_results_give_a_clear_answer():
    eagle = run({1: [150, 151], 2: [290, 292]})
    base = run({1: [100, 100], 2: [200, 201]})
    x = crossover(eagle, base)
    assert x["highest_winning_concurrency"] == 2 and "wins at every measured concurrency" in x["recommendation"]
    x = crossover(base, eagle)
    assert x["highest_winning_concurrency"] is None and "loses at every measured concurrency" in x["recommendation"]


def test_a_noisy_first_level_is_no_win():
    x = crossover(run({1: [100, 90]}), run({1: [95, 95]}))
    assert x["highest_winning_concurrency"] is None
    assert x["recommendation"].startswith("EAGLE-3 wins clearly at no measured concurrency; within noise at C=1")


def test_an_earlier_single_round_run_is_held_against_every_round():
    earlier = {"levels": [{"max_concurrency": 1, "output_throughput": 100}]}
    x = crossover(run({1: [130, 90, 110]}), earlier)
    assert x["levels"][0]["rounds"] == 3 and x["levels"][0]["verdict"] == "within noise"
    assert (x["levels"][0]["ratio_min"], x["levels"][0]["ratio_max"]) == (0.9, 1.3)
    assert crossover(run({1: [150, 151, 149]}), earlier)["levels"][0]["verdict"] == "won"
