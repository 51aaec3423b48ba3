"""A TEST STAND-IN for NVIDIA's apt repository: a local flat repository of stand-in packages named as
NVIDIA's, built with dpkg-deb and signed with a throwaway gpg key, so the driver and container-toolkit roles
run their real apt, dpkg hold and signed-by paths against a box with no network.

The packages install marker files and systemd unit files, no driver. Package names follow NVIDIA's CUDA
repository for Ubuntu (nvidia-driver-580-open, nvidia-fabricmanager-580, nvidia-container-toolkit); each
exists in two versions so a pin is seen to hold and an upgrade has somewhere to go. dkms and
linux-headers-KERNEL stand in for the distribution's; the stand-in dkms logs what it was asked.

The driver stands in for what a host sees of a real one: its userspace library (libcuda.so.VERSION, which the
stand-in `nvidia-ctk cdi generate` mounts, as the real one does), and its module loading at boot: an enabled
unit writes the package's version to /srv/fake/module-version (the tests' stand-in for
/sys/module/nvidia/version) unless /etc/rig-standin/module-never-loads exists (a driver whose module fails).

    python tests/nvidia_repo.py OUTDIR KERNEL    # OUTDIR/repo (Packages, Release, InRelease, *.deb), OUTDIR/key.gpg
"""
from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NVIDIA_CTK = r'''#!/usr/bin/python3
"""Stand-in nvidia-ctk: 'runtime configure --runtime=docker [--config=F]' and 'cdi generate --output=F'."""
import json, sys
args = sys.argv[1:]
opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
if args[:2] == ["runtime", "configure"]:
    path = opts.get("config", "/etc/docker/daemon.json")
    try:
        config = json.load(open(path))
    except FileNotFoundError:
        config = {}
    config.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    open(path, "w").write(json.dumps(config, indent=4) + "\n")
    print(f"INFO Wrote updated config to {path}")
elif args[:2] == ["cdi", "generate"]:
    import glob
    mounts = "".join(f"  - hostPath: {p}\n    containerPath: {p}\n    options: [ro, nosuid, nodev, bind]\n"
                     for p in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libcuda.so.*")))
    open(opts["output"], "w").write("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\ncontainerEdits:\n"
                                    "  mounts:\n" + mounts)
else:
    sys.exit(f"stand-in nvidia-ctk: unsupported {args}")
'''
UNIT = "[Unit]\nDescription={0} (stand-in)\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"
MODULE_UNIT = ("[Unit]\nDescription=NVIDIA kernel module {0} loading at boot (stand-in)\n[Service]\nType=oneshot\n"
               "ExecStart=/bin/sh -c '[ -e /etc/rig-standin/module-never-loads ] || echo {0} > /srv/fake/module-version'\n"
               "[Install]\nWantedBy=multi-user.target\n")
DKMS = "#!/bin/sh\necho \"$*\" >> /var/log/dkms-standin.log\n"
LINK = "link:"  # a file whose content starts so is a symbolic link to the rest


def packages(kernel: str) -> list[tuple[str, str, dict[str, str]]]:
    """(name, version, {path: content}) of every stand-in."""
    out = []
    for version in ("580.159.04-1", "580.200.00-1"):
        upstream = version.rsplit("-", 1)[0]
        out.append(("nvidia-driver-580-open", version,
                    {"usr/lib/systemd/system/nvidia-persistenced.service": UNIT.format("NVIDIA persistence daemon"),
                     f"usr/lib/x86_64-linux-gnu/libcuda.so.{upstream}": "",
                     "usr/lib/systemd/system/nvidia-standin-module.service": MODULE_UNIT.format(upstream),
                     "etc/systemd/system/multi-user.target.wants/nvidia-standin-module.service":
                         LINK + "/usr/lib/systemd/system/nvidia-standin-module.service"}))
        out.append(("nvidia-fabricmanager-580", version,
                    {"usr/lib/systemd/system/nvidia-fabricmanager.service": UNIT.format("NVIDIA fabric manager")}))
    for version in ("1.18.0-1", "1.19.0-1"):
        out.append(("nvidia-container-toolkit", version, {"usr/bin/nvidia-ctk": NVIDIA_CTK}))
    out.append(("dkms", "3.0.10-8", {"usr/sbin/dkms": DKMS}))
    out.append((f"linux-headers-{kernel}", "1.0-1", {}))
    return out


def build_deb(name: str, version: str, files: dict[str, str], out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: rig tests <rig@localhost>\n"
            f"Description: rig test stand-in for {name}\n")
        (root / "usr" / "share" / "doc" / name).mkdir(parents=True)
        (root / "usr" / "share" / "doc" / name / "STAND-IN").write_text(f"{name} {version}: a rig test stand-in\n")
        for rel, content in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            if content.startswith(LINK):
                (root / rel).symlink_to(content[len(LINK):])
                continue
            (root / rel).write_text(content)
            (root / rel).chmod(0o755 if rel.startswith(("usr/bin/", "usr/sbin/")) else 0o644)
        deb = out / f"{name}_{version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                       check=True, capture_output=True)
        return deb


def index(repo: Path) -> None:
    """Packages (and .gz), then a Release naming their hashes: a flat repository ("deb URL /")."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        data = deb.read_bytes()
        stanzas.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    text = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(text)
    (repo / "Packages.gz").write_bytes(gzip.compress(text, mtime=0))
    lines = ["Origin: rig tests", "Label: NVIDIA stand-in", "Suite: ./", "Date: Mon, 30 Nov 2026 00:00:00 UTC",
             "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")


def sign(repo: Path, key_out: Path) -> None:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "GNUPGHOME": home}
        gpg = ["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]
        subprocess.run(gpg + ["--quick-gen-key", "rig test repository <rig@localhost>", "ed25519", "sign", "1d"],
                       check=True, env=env, capture_output=True)
        subprocess.run(gpg + ["--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
                       check=True, env=env, capture_output=True)
        subprocess.run(gpg + ["--export", "-o", str(key_out)], check=True, env=env, capture_output=True)


def build(out: Path, kernel: str) -> Path:
    repo = out / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    for name, version, files in packages(kernel):
        build_deb(name, version, files, repo)
    index(repo)
    sign(repo, out / "key.gpg")
    return repo


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), sys.argv[2]))
