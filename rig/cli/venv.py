"""The `rig venv` group: the stack's virtualenv on a target."""
from __future__ import annotations

import click

from rig.cli.common import (
    check_option,
    emit,
    find_links_option,
    group,
    json_option,
    judged,
    lock_hash_option,
    lock_option,
    manifest_option,
    opt_in_option,
    out_option,
    patched_option,
    patches_option,
    shared,
    store_option,
    venv_of,
    venv_option,
    wheelhouse_option,
    whose_stack,
)
from rig.cli.types import FILE, Choice, PathOrUrl, Seconds
from rig.patches.actions import carried
from rig.patches.env import environment
from rig.patches.patchset import asked, identity, load
from rig.python import lock as locking
from rig.python.installer import INSTALLERS
from rig.python.venv import add, install, verify
from rig.python.venv_archive.image import IMAGE, image
from rig.python.venv_archive.manifest import ANY_PATCHES, read_manifest
from rig.python.venv_archive.mount import looked_at, mount
from rig.python.venv_archive.pack import pack
from rig.python.venv_archive.place import STORE, rig_link
from rig.python.venv_archive.pull import PULL_TIMEOUT, restore
from rig.python.venv_archive.tree import verify_against

pull_timeout = shared("--timeout", type=Seconds(), default=PULL_TIMEOUT, show_default=True)


_ASKED = ("The rig patch set the venv is to carry (--patched, with each --opt-in) or none (--unpatched): one of another "
          "set, as its manifest records it, is refused before anything is pulled. Default: not asked.")


def _patch_set(said: str):
    """--patched/--unpatched, --opt-in and --patches, SAID saying what the patch set is to the command."""
    def options(func):
        func = patches_option(help="The patch set's directory (default: rig's own).")(func)
        func = opt_in_option(help="With --patched: the opt-in patches of FEATURE too; repeatable.")(func)
        return patched_option(help=said)(func)
    return options


def _taken(thing: str, manifest: str):
    """What unpack and mount share, THING (archive, image) taken by its MANIFEST option: --lock, --timeout, the patch
    set asked for, --check and --json."""
    def options(func):
        for option in (json_option, check_option, _patch_set(_ASKED),
                       pull_timeout(help=f"Seconds the {thing}'s download may take in all; run again to resume one "
                                         "cut off."),
                       lock_option(help=f"The stack's lock: an {thing} of any other lock is refused before anything "
                                        f"is pulled or written; with a directory for {manifest}, it names the {thing} "
                                        "to take there.")):
            func = option(func)
        return func
    return options


def _patches(patched: bool | None, opt_in: tuple[str, ...], patch_dir: str | None, venv: str | None = None):
    """The patch set asked for: ANY_PATCHES without --patched/--unpatched, None with --unpatched, else the set's
    identity (rig.patches.patchset.identity), where VENV is given once the venv holds it exactly."""
    if not patched:
        if opt_in:
            raise click.UsageError("--opt-in names patches: give it with --patched")
        return ANY_PATCHES if patched is None else None
    if venv is not None:
        env, found, opted = environment(venv, None, None, patch_dir, opt_in)
        return carried(env, found, asked(found, opted))
    found = load(patch_dir)
    return identity(found, asked(found, opt_in))


@group()
def venv() -> None:
    """The stack's virtualenv on a target, installed offline from a wheelhouse."""


@venv.command("install")
@venv_option()
@whose_stack
@lock_option(help="The stack's lock: with --find-links, pull everything from that URL, "
                 "pip's wheel and requirements checked against the lock (hosts of a fleet).")
@lock_hash_option(help="lock_hash of the lock being installed (without --lock).")
@click.option("--python-version", metavar="VERSION",
              help="The lock's Python, checked against this host (without --lock).")
@wheelhouse_option()
@find_links_option(help="Take the wheels from this URL (or directory); the wheelhouse dir then needs only its "
                        "requirements file and pip wheel (image builds), or none with --lock.")
@click.option("--installer", type=Choice(INSTALLERS), default="pip", show_default=True,
              help="uv (rig's pinned wheel, from the wheelhouse; about twice as fast) or pip (the lock's own).")
@click.option("--compile/--no-compile", "byte_compile", default=True, show_default=True,
              help="Byte-compile every module at install. A server whose account cannot write the venv needs it; "
                   "a throwaway venv that imports a few modules (a CI job's) starts sooner without it.")
@check_option
@json_option
def venv_install(venv_path, stack_path, lock_file, lock_hash, python_version, wheelhouse, find_links, installer,
                 byte_compile, check, as_json) -> None:
    """Install a lock's wheels with --no-index --require-hashes; a no-op when current."""
    lock = locking.read(lock_file) if lock_file else None
    if lock is not None:
        lock_hash, python_version = lock["lock_hash"], lock["python"]
    elif not (lock_hash and python_version):
        raise click.UsageError("give --lock, or --lock-hash and --python-version")
    emit(install(venv_of(venv_path, stack_path), lock_hash, python_version, wheelhouse, check, find_links, lock,
                 installer, byte_compile), as_json)


@venv.command("verify")
@venv_option()
@whose_stack
@manifest_option(help="Also check the venv against this manifest: an archive's NAME.manifest.json (rig venv pack "
                      "wrote it) file by file, every entry with its mode, size and sha256, nothing more but what Python "
                      "caches; or an image's NAME.image.json (rig venv image wrote it): the venv is that image, "
                      "mounted from its file, whose sha256 is the manifest's. A venv rig mounted is checked through "
                      "its link.")
@json_option
def venv_verify(venv_path, stack_path, manifest, as_json) -> None:
    """Check every locked package is installed at its locked version (and, with --manifest, every file or the image)."""
    venv_path = venv_of(venv_path, stack_path)
    result = verify(venv_path)
    said = [f"{venv_path}: {result['packages']} packages as locked" if result["ok"]
            else f"{venv_path}: differs from its lock: {result['mismatched']}"]
    if manifest and str(manifest).endswith(IMAGE.manifest_suffix):
        seen = looked_at(venv_path, IMAGE.read(manifest, "venv image manifest"))
        if not seen["image"]:
            seen = {**seen, "ok": False, "problems": [f"{venv_path} is no venv image rig mounted (no link rig made)"]}
        result = {**result, "ok": result["ok"] and seen["ok"], "image": seen}
        said.append(f"image {seen['name']}, mounted at {seen['mount']}, its sha256 its manifest's; "
                    f"{seen['kept_checked']}" if seen["ok"] else
                    "not the image its manifest describes: " + "; ".join(seen["problems"]))
    elif manifest:
        against = verify_against(rig_link(venv_path, None) or venv_path, read_manifest(manifest))
        result = {**result, "ok": result["ok"] and against["ok"], "archive": against}
        said.append(f"every one of its {against['entries']} archive entries as packed" if against["ok"] else
                    f"differs from the archive in {len(against['differs'])} places: " +
                    "; ".join(against["differs"][:10]) + ("; ..." if len(against["differs"]) > 10 else ""))
    emit({**result, "msg": "; ".join(said)}, as_json)
    judged(result["ok"])


@venv.command("pack")
@venv_option()
@whose_stack
@out_option(None, "NAME.tar.zst and NAME.manifest.json go here (NAME: venv-LOCK-pyX.Y-ARCH).", required=True)
@_patch_set("--patched: the venv holds rig's patch set exactly (checked: an apply would change nothing), and the "
            "manifest records it (an image made from the archive too); a host asking for another set takes neither. "
            "Default: none recorded.")
@check_option
@json_option
def venv_pack(venv_path, stack_path, out_dir, patched, opt_in, patch_dir, check, as_json) -> None:
    """Pack a venv rig installed as one reproducible zstd tar and its manifest; a no-op when already packed."""
    venv_path = venv_of(venv_path, stack_path)
    patches = _patches(patched, opt_in, patch_dir, venv_path)
    emit(pack(venv_path, out_dir, check, None if patches == ANY_PATCHES else patches), as_json)


@venv.command("unpack")
@venv_option()
@whose_stack
@manifest_option(type=PathOrUrl(), metavar="FILE_OR_URL", required=True,
                 help="The archive's NAME.manifest.json: a file, or an http(s) URL whose archive beside it is "
                      "pulled (a pull cut short resumes where it stopped); or the directory (URL) holding it, with "
                      "--lock.")
@click.option("--archive", type=FILE, metavar="FILE",
              help="The NAME.tar.zst to unpack (default: the one beside --manifest, pulled when it is a URL).")
@_taken("archive", "--manifest")
def venv_unpack(venv_path, stack_path, manifest, archive, lock_file, timeout, patched, opt_in, patch_dir, check,
                as_json) -> None:
    """Unpack a venv archive as the venv, checked byte for byte against its manifest; a no-op when current."""
    lock_hash = locking.read(lock_file)["lock_hash"] if lock_file else None
    read = {what: path for what, path in (("stack", stack_path), ("lock", lock_file)) if path}
    emit(restore(manifest, venv_of(venv_path, stack_path), archive, lock_hash, check, timeout, read,
                 _patches(patched, opt_in, patch_dir)), as_json)


@venv.command("add")
@venv_option()
@whose_stack
@click.option("--requirements-sha256", required=True, metavar="SHA256",
              help="sha256 of the export's list (rig wheels export prints it).")
@wheelhouse_option(help="The exported dir holding the wheels (needed only when something changes).")
@find_links_option()
@check_option
@json_option
def venv_add(venv_path, stack_path, requirements_sha256, wheelhouse, find_links, check, as_json) -> None:
    """Install rig-built wheels into a stack venv, hash-checked; a no-op when already there."""
    emit(add(venv_of(venv_path, stack_path), wheelhouse, requirements_sha256, check, find_links), as_json)


@venv.command("image")
@manifest_option(required=True, help="The venv archive's NAME.manifest.json (rig venv pack wrote it), checked whole; "
                                     "its NAME.tar.zst beside it is imaged, its sha256 checked as it is read.")
@out_option(None, "NAME.sqfs and NAME.image.json go here (NAME: the archive's).", required=True)
@check_option
@json_option
def venv_image(manifest, out_dir, check, as_json) -> None:
    """Build a read-only squashfs image of a venv archive, reproducibly; a no-op when already built.

    The archive's tar streams into mksquashfs (squashfs-tools 4.5+): no file of the venv is written out. Every time
    is the archive's fixed one, so the bytecode stays fresh on a read-only mount. `rig venv mount` mounts it."""
    emit(image(manifest, out_dir, check=check), as_json)


@venv.command("mount")
@venv_option(help="The venv's path: made a link to the image's mount point (a venv directory there is moved aside, "
                  "never deleted).")
@whose_stack
@click.option("--image-manifest", type=PathOrUrl(), metavar="FILE_OR_URL", required=True,
              help="The image's NAME.image.json: a file, or an http(s) URL whose image beside it is pulled (a pull "
                   "cut short resumes); or the directory (URL) holding it, with --lock.")
@store_option(default=str(STORE),
              help="Where images are kept and mounted, a directory per venv path: the current image and the one "
                   "before stay (a rollback mounts the previous manifest and only moves the link); older ones are "
                   "unmounted and deleted.")
@_taken("image", "--image-manifest")
def venv_mount(venv_path, stack_path, image_manifest, lock_file, store, timeout, patched, opt_in, patch_dir, check,
               as_json) -> None:
    """Mount a venv image read-only (root) and link the venv's path to it; a no-op when already.

    Where this host cannot mount it (not root, no loop device, no squashfs), exits 4 with `reason: cannot-mount`
    under --json: unpack the archive instead (rig venv unpack)."""
    lock_hash = locking.read(lock_file)["lock_hash"] if lock_file else None
    emit(mount(image_manifest, venv_of(venv_path, stack_path), lock_hash, check, timeout, store,
               _patches(patched, opt_in, patch_dir)), as_json)
