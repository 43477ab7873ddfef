import pytest

from tilefuse import config


def test_defaults_from_empty_environment(tmp_path):
    cfg = config.load({"XDG_CACHE_HOME": str(tmp_path)})
    assert cfg.debug == 0
    assert cfg.cache_dir == tmp_path / "tilefuse"
    assert cfg.autotune is None  # decided by the device
    assert cfg.interpret == "auto"
    assert cfg.strict is False
    assert cfg.nvcc == "nvcc" and cfg.hip_clang == "clang-19"


def test_values_are_parsed_and_typed(tmp_path):
    cfg = config.load({"TILEFUSE_DEBUG": "2", "TILEFUSE_CACHE_DIR": str(tmp_path / "c"), "TILEFUSE_AUTOTUNE": "0",
                       "TILEFUSE_INTERPRET": "1", "TILEFUSE_STRICT": "yes", "TILEFUSE_NVCC": "/opt/nvcc"})
    assert cfg.debug == 2 and cfg.cache_dir == tmp_path / "c"
    assert cfg.autotune is False and cfg.interpret == "1" and cfg.strict is True and cfg.nvcc == "/opt/nvcc"


@pytest.mark.parametrize("env, needle", [
    ({"TILEFUSE_DEBUG": "7"}, "TILEFUSE_DEBUG='7': expected an integer in 0..3"),
    ({"TILEFUSE_DEBUG": "loud"}, "TILEFUSE_DEBUG='loud'"),
    ({"TILEFUSE_AUTOTUNE": "maybe"}, "TILEFUSE_AUTOTUNE='maybe': expected 0 or 1"),
    ({"TILEFUSE_INTERPRET": "cpu"}, "expected one of auto, 0, 1"),
])
def test_bad_values_name_the_variable_and_the_accepted_values(env, needle):
    with pytest.raises(ValueError) as info:
        config.load(env)
    assert needle in str(info.value)


def test_override_is_scoped():
    before = config.get()
    with config.override(debug=3, strict=True) as cfg:
        assert config.get() is cfg and cfg.debug == 3 and cfg.strict
    assert config.get() is before


def test_log_respects_level(capsys):
    with config.override(debug=1):
        config.log(1, "shown")
        config.log(2, "hidden")
    err = capsys.readouterr().err
    assert "[tilefuse] shown" in err and "hidden" not in err


def test_no_other_module_reads_the_environment():
    """DESIGN.md: config.py is the one reader of os.environ (writes for child processes are allowed)."""
    import pathlib
    import re

    root = pathlib.Path(config.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "config.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ\.get|os\.getenv|os\.environ\[[^\]]+\](?!\s*=)", line) and "environ.items()" not in line:
                offenders.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    assert not offenders, "read the setting through tilefuse.config instead:\n" + "\n".join(offenders)
