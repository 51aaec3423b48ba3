"""`rig venv mount`: a venv image pulled into the host's store, mounted read-only, and the venv's path made a link
to it, switched in one rename. The store keeps the current image and the one before (mounted, for a rollback that
only moves the link back: `rig venv mount` of the previous manifest); older ones are unmounted and deleted.

Per venv path, the store directory STORE/VENVNAME-HASH holds NAME.sqfs, NAME.image.json, the mount point NAME/ and
state.json ({"current", "previous"}); the venv path links to STORE/VENVNAME-HASH/NAME."""
from __future__ import annotations

import itertools
import os
import secrets
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import atomic_write, held, open_regular, plain_dir, private_dir, read_bytes, take_place
from rig.core.schema import Field
from rig.python.venv_archive.image import IMAGE, read_image_manifest
from rig.python.venv_archive.manifest import ANY_PATCHES, absolute, digest_of, fits, lies_inside, manifest_source
from rig.python.venv_archive.mounts import CannotMount, attach, detach, mountable, mounted, mounted_from
from rig.python.venv_archive.place import IMAGE_NAME, STORE, STORE_WHAT, rig_link, store_of, venv_place
from rig.python.venv_archive.pull import PULL_TIMEOUT, pull
from rig.python.venv_archive.verity import keep_checked, measured

STATE = "state.json"
LOCK = ".mount.lock"  # held while a run looks and mounts: two runs take turns


def _image_name(value: str | None) -> str | None:
    return None if value is None or IMAGE_NAME.fullmatch(value) else f"{value[:80]!r} is no image name"


STATE_SPEC = Field(dict, fields={"current": Field(required=True, check=_image_name),
                                 "previous": Field((str, type(None)), check=_image_name)})


def mount(source: str, venv: str | Path, lock_hash: str | None = None, check: bool = False,
          timeout: float = PULL_TIMEOUT, root: str | Path = STORE, patches: dict | str | None = ANY_PATCHES) -> dict:
    """The image SOURCE describes (its manifest: a file, a URL, or a directory of either with LOCK_HASH) mounted
    and linked at VENV. Every refusal comes before anything is pulled or changed; a no-op where it is already."""
    venv = absolute(venv)
    source = manifest_source(source, lock_hash, IMAGE)
    manifest = read_image_manifest(source)
    if why := fits(manifest, lock_hash, venv, patches):
        raise RigError(f"image {manifest['image']['name']} does not fit {venv}: {why}")
    root = absolute(root)  # a relative --store made a relative link, and never matched the mount table
    store = _store(root, venv)
    looked = _mounted_at(source, manifest, venv, store, True, timeout)  # every refusal, before the store is made
    if check or not looked["changed"]:
        return looked
    _made(store)
    with held(store / LOCK):  # a second run looks once the first has mounted and linked: one mount, not two
        _store(root, venv)  # again, now that it is made, under the lock: the store used is the store checked
        return _mounted_at(source, manifest, venv, store, check, timeout)


def _mounted_at(source: str, manifest: dict, venv: Path, store: Path, check: bool, timeout: float) -> dict:
    """mount()'s look at VENV and STORE, and what it does, once the manifest fits and the store is rig's."""
    name = manifest["image"]["name"]
    image, where = store / f"{name}{IMAGE.suffix}", store / name
    place = venv_place(venv, store.parent)
    linked = place.target
    ours = _mount_point(where, image)
    state = _state(store)
    result = {"venv": str(venv), "image": str(image), "mount": str(where), "name": name}
    if ours and linked == where:
        with open_regular(image, "the venv image", follow=False) as handle:
            verity = measured(handle.fileno())
        return {**result, "changed": False, "verity": verity,
                "msg": f"{venv} is image {name}, mounted at {where}; {_verity_said(verity)}"}
    if not ours and (why := mountable()):
        raise CannotMount(f"cannot mount image {name}: {why}", hint="unpack the venv archive instead (rig venv unpack)")
    aside = _aside_name(venv) if place.kind == "dir" else None
    steps = ([] if ours else [f"pull {name} into {store} and mount it at {where}"]) + \
        ([f"move the directory {venv} aside to {aside}"] if aside else []) + [f"link {venv} to {where}"]
    if check:
        return {**result, "changed": True, "msg": "would " + "; ".join(steps)}
    if not ours:
        pulled = pull(source, store, manifest, timeout, IMAGE)
        verity = keep_checked(pulled)  # before the mount: the tree is built from the bytes pull just checked
        where.mkdir(mode=0o755, exist_ok=True)
        progress(f"mounting {pulled} at {where}")
        attach(pulled, where)
    else:
        verity = keep_checked(image)  # mounted before (read-only: no writer stops it), perhaps by an older rig
    previous = _previous(state, name, linked)
    _switch(venv, where, aside)
    atomic_write(store / STATE, dump_json({"current": name, "previous": previous}, "the venv images' state") + "\n")
    collected, busy = _collect(store, {name, previous})
    said = [f"{venv} is now image {name}, mounted at {where}" + (f" (it was {linked.name})" if linked else ""),
            _verity_said(verity)]
    said += [f"the directory that was there is moved aside to {aside}: remove it once the image serves"] if aside else []
    said += [f"collected {', '.join(collected)}"] if collected else []
    said += [f"kept {', '.join(busy)}: still in use, collected next time"] if busy else []
    return {**result, "changed": True, "previous": previous, "moved_aside": str(aside) if aside else None,
            "collected": collected, "verity": verity, "msg": "; ".join(said)}


def _verity_said(verity: dict) -> str:
    """What keeps the mounted image checked, in words (verity.keep_checked's or verity.measured's answer)."""
    if verity["on"]:
        return f"fs-verity keeps it checked while mounted (its fs-verity digest {verity['digest']})"
    return f"nothing keeps it checked while mounted: {verity['why']}"


def _store(root: Path, venv: Path) -> Path:
    """The venv's store directory; refused where it is a link or no directory, where someone but root may change
    it or a directory above it (the image could be swapped between its check and its mount), or where it lies
    inside the venv (moved aside with a venv directory, or inside the read-only image)."""
    store = store_of(venv, root)
    for path in (root, store):
        plain_dir(path, "rig keeps venv images only in a directory of its own")
    private_dir(store, STORE_WHAT)
    if lies_inside(store, venv):
        raise RigError(f"the image store {store} lies inside the venv {venv}, which the image replaces",
                       hint="give a --store outside the venv")
    return store


def _made(store: Path) -> None:
    """STORE and its root made (mode 0755 whatever the umask: nobody else may write where images are kept)."""
    store.parent.parent.mkdir(parents=True, exist_ok=True)
    for path in (store.parent, store):
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            continue  # made before (or by someone else: the check under the lock says)
        os.chmod(path, 0o755)


def _state(store: Path) -> dict:
    """The store's state.json ({"current", "previous"}: the image to keep for a rollback), read before anything
    changes; one rig did not write (a link, a FIFO, not its shape) is refused, naming the fix."""
    if not os.path.lexists(store / STATE):
        return {"current": None, "previous": None}
    try:
        return parse_json(read_bytes(store / STATE, "the venv images' state", follow=False).decode(errors="replace"),
                          str(store / STATE), STATE_SPEC)
    except RigError as exc:
        raise RigError(f"{exc}; {store / STATE} is not a state rig wrote",
                       hint=f"remove {store / STATE} (it names only the image a rollback keeps) and run again") from None


def _mount_point(where: Path, image: Path) -> bool:
    """Whether IMAGE is already mounted at WHERE; a link there, or anything else mounted there, is refused."""
    plain_dir(where, "the mount point must be a directory rig made")
    if mounted_from(where, image):
        return True
    other = mounted(where)
    if other is not None:
        raise RigError(f"{where} already has {other['backing'] or other['source']} ({other['type']}) mounted, not "
                       f"{image}", hint=f"unmount it (umount {where}) and run again")
    if os.path.lexists(where) and any(where.iterdir()):
        raise RigError(f"the mount point {where} holds files; rig mounts only on an empty directory",
                       hint=f"remove what is in {where} and run again")
    return False


def _aside_name(venv: Path) -> Path:
    """Where a venv directory goes when an image takes its path: beside it, never over anything there."""
    for count in itertools.count(1):
        aside = venv.with_name(f"{venv.name}.rig-before-image" + (f"-{count}" if count > 1 else ""))
        if not os.path.lexists(aside):
            return aside
    raise AssertionError("unreachable")


def _switch(venv: Path, where: Path, aside: Path | None) -> None:
    """VENV made a link to WHERE in one rename (a new link beside it replaces the old link); a venv directory is
    moved ASIDE first (a rename cannot put a link over a directory: for that moment no venv is at VENV), and put
    back where the link cannot take its place (take_place)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    temporary = venv.with_name(f".{venv.name}.rig-link-{secrets.token_hex(6)}")  # symlink() fails where one is
    os.symlink(where, temporary)
    if aside is not None:
        progress(f"moving the directory {venv} aside to {aside}")
    try:
        take_place(temporary, venv, aside, "the venv directory")
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _previous(state: dict, name: str, linked: Path | None) -> str | None:
    """The image to keep beside NAME: the one the venv linked to before (LINKED), else the one the store's STATE
    last held (after a fallback to a directory, the last image stays the one to go back to)."""
    candidates = [linked.name if linked else None, state["current"], state["previous"]]
    return next((candidate for candidate in candidates if candidate and candidate != name), None)


def _collect(store: Path, kept: set) -> tuple[list[str], list[str]]:
    """Every image in STORE but KEPT's unmounted and deleted (image, manifest, mount point, partial download): the
    names collected, and those still in use (kept, to collect next time)."""
    names = {entry.name.removesuffix(IMAGE.suffix).removesuffix(IMAGE.manifest_suffix).removesuffix(".sqfs.part")
             for entry in store.iterdir()}
    collected, busy = [], []
    for name in sorted(n for n in names if IMAGE_NAME.fullmatch(n) and n not in kept):
        where = store / name
        if why := _unmounted(where, store / f"{name}{IMAGE.suffix}"):
            busy.append(f"{name} ({why})")
            continue
        try:
            if where.is_dir() and not where.is_symlink():
                where.rmdir()
        except OSError as exc:
            busy.append(f"{name} ({where}: {exc.strerror or exc})")
            continue
        for leftover in (f"{name}{IMAGE.suffix}", f"{name}{IMAGE.manifest_suffix}", f"{name}.sqfs.part",
                         f".{name}.pull.lock"):
            (store / leftover).unlink(missing_ok=True)
        collected.append(name)
    return collected, busy


def _unmounted(where: Path, image: Path) -> str | None:
    """WHERE with nothing mounted on it: rig's mounts of IMAGE there undone; why not (busy), or None. Whatever
    else is mounted there (a bind mount someone made) stays: rig unmounts only what it mounted."""
    for _ in range(8):  # each pass undoes one mount; rig never mounts one image twice at one point
        seen = mounted(where)
        if seen is None:
            return None
        if not mounted_from(where, image):
            return f"{seen['backing'] or seen['source']} ({seen['type']}) is mounted there, not its image"
        if why := detach(where):
            return why
    return f"{where} is still mounted"


def looked_at(venv: str | Path, manifest: dict | None = None) -> dict:
    """VENV as an image: {"image": False} where it is no link rig made; else its image's name, mount point and
    file, and "ok" with the "problems" found: whether that file is what is mounted there, and whether its sha256 is
    MANIFEST's (else the store's copy of it); whether fs-verity keeps it checked ("verity", "kept_checked": in
    words). "looked" False where a file could not be read (not root)."""
    target = rig_link(venv, None)
    if target is None:
        return {"image": False}
    name, store = target.name, target.parent
    image, described = store / f"{name}{IMAGE.suffix}", store / f"{name}{IMAGE.manifest_suffix}"
    said = {"image": True, "name": name, "mount": str(target), "file": str(image), "looked": True}
    problems = []
    if not mounted_from(target, image):
        other = mounted(target)
        problems.append(f"nothing is mounted at {target}" if other is None else
                        f"{target} has {other['backing'] or other['source']} mounted, not {image}")
    try:
        manifest = manifest or read_image_manifest(described)
        if manifest["image"]["name"] != name:
            problems.append(f"it is image {name}, the manifest describes {manifest['image']['name']}")
        with open_regular(image, "the venv image", follow=False) as handle:
            verity = measured(handle.fileno())
            try:
                if digest_of(handle) != (manifest["image"]["sha256"], manifest["image"]["size"]):
                    problems.append(f"{image}'s bytes are not its manifest's (sha256 or size differs)")
            except OSError as exc:  # EIO: fs-verity refuses to hand out bytes changed since it was turned on
                problems.append(f"{image} could not be read whole ({exc.strerror or exc}): its bytes changed")
    except RigError as exc:
        return {**said, "looked": False, "ok": False, "problems": [*problems, str(exc)]}
    return {**said, "sha256": manifest["image"]["sha256"], "verity": verity, "kept_checked": _verity_said(verity),
            "ok": not problems, "problems": problems}
