"""rig venv install from a wheelhouse made here (a one-module wheel and this venv's own pip, zipped as its wheel):
every module byte-compiled by default, none with --no-compile."""
import base64
import hashlib
import platform
import zipfile
from pathlib import Path

import pip
import pytest
from harness.commands import rig


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheelhouse(house: Path) -> Path:
    files = {"rigtiny/__init__.py": b"VALUE = 42\n",
             "rigtiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: rigtiny\nVersion: 1.0\n",
             "rigtiny-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: rig-test\nRoot-Is-Purelib: true\n"
                                            b"Tag: py3-none-any\n"}
    record = "\n".join([*(_record_line(n, d) for n, d in files.items()), "rigtiny-1.0.dist-info/RECORD,,"]) + "\n"
    wheel = house / "rigtiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for name, data in {**files, "rigtiny-1.0.dist-info/RECORD": record.encode()}.items():
            out.writestr(name, data)
    with zipfile.ZipFile(house / f"pip-{pip.__version__}-py3-none-any.whl", "w") as out:
        for path in sorted(Path(pip.__file__).parent.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out.write(path, path.relative_to(Path(pip.__file__).parent.parent))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (house / "requirements.txt").write_text(f"rigtiny==1.0 --hash=sha256:{sha}\n")
    return house


@pytest.mark.parametrize("flag, compiled", [((), True), (("--no-compile",), False)])
def test_the_venvs_modules_are_byte_compiled_unless_asked_not_to(tmp_path, flag, compiled):
    house = tmp_path / "house"
    house.mkdir()
    venv = tmp_path / "venv"
    done = rig("venv", "install", "--venv", str(venv), "--lock-hash", "a" * 64, "--python-version",
               ".".join(platform.python_version_tuple()[:2]), "--wheelhouse", str(wheelhouse(house)),
               "--installer", "pip", *flag)
    assert done.returncode == 0, done.stderr
    package = next(venv.glob("lib/python*/site-packages/rigtiny"))
    assert (package / "__init__.py").read_text() == "VALUE = 42\n"
    assert bool(list(package.glob("__pycache__/__init__.*.pyc"))) == compiled
