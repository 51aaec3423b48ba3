"""An installed venv as one archive: NAME.tar.zst and, beside it, NAME.manifest.json that lists every entry.

A host that unpacks it gets the venv a build host installed, byte for byte, in one download instead of an
install: no wheel is unpacked or compiled again. The archive is reproducible (the same venv packs to the same
bytes), so its sha256 names its content; the manifest holds that hash and every entry's, and unpacking checks
both, writing into a staging directory that takes the venv's place only once every byte has matched. A venv
holds its own absolute path (its scripts' #! lines, activate), so an archive fits only the path it was packed at.

manifest: the format, and whether an archive fits this host; tree: a venv's entries, and a venv compared with a
manifest; pack: a venv into an archive; pull: an archive from a server; members: the archive's tar read member by
member against the manifest (unpack and image both read it so); unpack: an archive into a venv.
"""
