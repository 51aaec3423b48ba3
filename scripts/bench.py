#!/usr/bin/env python3
"""Benchmarks behind docs/BENCHMARKS.md; each writes its own section of it.

    python scripts/bench.py provision [--rounds 1]   make provision (default stack): cold, warm, no-op;
                                                     site.yml on 1 box vs 3, bytes
    python scripts/bench.py lock [--rounds 3]        rig lock and wheelhouse fetch: cold, warm
    python scripts/bench.py wheels [--rounds 3]      rig audit of sgl-kernel 0.3.21 (535 MB); rig wheels
                                                     build of the test extension: cold vs ccache
    python scripts/bench.py image [--rounds 1]       rig image build: cold (--no-cache), then a patch-only
                                                     rebuild; the runtime image's size
    python scripts/bench.py client [--rounds 3]      rig bench's client at C=250 against the SGLang API
                                                     stand-in: measured vs generated tok/s; tokens per
                                                     client CPU second
    python scripts/bench.py installer [--rounds 3]   the default lock's venv from a local wheelhouse: pip as rig
                                                     runs it, pip with bytecode compiled in parallel, uv
    python scripts/bench.py hostile [--examples 200] how many hostile inputs the tests try and how many
                                                     hold (reliability, not speed)
    python scripts/bench.py checks [--rounds 3]      what each agreement and peer check costs: validate's
                                                     toolchain, doctor's toolkit / venv agreement, pcie-p2p,
                                                     one probed GPU pair (stand-in worker)
    python scripts/bench.py tasks [--rounds 3]       what one role task costs on a box (docker_api): the rig
                                                     action with the bundle kept on the host against sent per
                                                     task, a command task with pipelining on against off
    python scripts/bench.py suite [--rounds 1]       make test on a fresh clone of HEAD as CI runs it: the
                                                     install, each pytest run, lint and the rest

Kinds are interleaved round by round so that machine noise hits them alike;
medians and ranges are reported. Bytes are those the host received on its
non-loopback, non-container interfaces while a step ran.
"""
from __future__ import annotations

import argparse

# scripts/ is on sys.path when this file runs: each benchmark is a module of scripts/benchmarks/
from benchmarks import (
    checks,
    client,
    cubins,
    hostile,
    image,
    installer,
    lock,
    provision,
    suite,
    tasks,
    venv_take,
    wheels,
)

RUNS = {"provision": provision.bench_provision, "lock": lock.bench_lock, "wheels": wheels.bench_wheels,
        "client": client.bench_client, "image": image.bench_image, "installer": installer.bench_installer,
        "checks": checks.bench_checks, "cubins": cubins.bench_cubins, "tasks": tasks.bench_tasks,
        "suite": suite.bench_suite, "venv-take": venv_take.bench_venv_take}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["provision", "lock", "wheels", "client", "image", "hostile", "installer",
                                          "checks", "cubins", "tasks", "suite", "venv-take"])
    parser.add_argument("--examples", type=int, default=200, help="hostile: examples per generated property")
    parser.add_argument("--rounds", type=int, help="default 3; 1 for image (a cold build takes minutes)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.which in ("image", "provision", "suite") else 3)
    if args.which == "hostile":
        hostile.bench_hostile(args.examples)
    else:
        RUNS[args.which](args.rounds)


if __name__ == "__main__":
    main()
