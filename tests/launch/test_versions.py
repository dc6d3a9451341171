import pytest

from zeropilot.errors import InputError
from zeropilot.launch.versions import parse_overrides, parse_version, read_requirements, resolve_versions


@pytest.mark.parametrize("raw, public, local", [
    ("0.14.2+das.opt1.dtk25041", "0.14.2", "das.opt1.dtk25041"),
    ("0.14.2das.opt1.dtk25041", "0.14.2", "das.opt1.dtk25041"),
    ("2.1.0+rocm5.6", "2.1.0", "rocm5.6"),
    ("4.46.1", "4.46.1", None),
    ("v1.2", "1.2", None),
])
def test_vendor_versions(raw, public, local):
    v = parse_version(raw)
    assert v.public == public and v.local == local


def test_overrides_win_and_local_label_is_ignored_in_ranges():
    versions = resolve_versions("deepspeed=0.14.2+das.opt1.dtk25041", use_installed=False)
    assert versions.satisfies("deepspeed", "<0.15") is True
    assert versions.satisfies("deepspeed", ">=0.14.2") is True
    assert versions.satisfies("transformers", ">=4") is None
    assert versions.is_rocm is True


@pytest.mark.parametrize("bad", ["deepspeed", "deepspeed=", "nosuchpkg=1.0", "torch=abc"])
def test_bad_overrides(bad):
    with pytest.raises(InputError):
        parse_overrides(bad)


def test_requirements_file(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# pinned\ntransformers==4.46.1\ndeepspeed===0.16.0 ; python_version>'3'\ntorch>=2\n")
    found = read_requirements(req)
    assert found["transformers"].raw == "4.46.1" and found["transformers"].source.endswith(":2")
    assert found["deepspeed"].raw == "0.16.0" and "torch" not in found
    versions = resolve_versions(None, [req], use_installed=False)
    assert versions.raw("transformers") == "4.46.1"


def test_installed_versions_read_from_metadata():
    versions = resolve_versions()
    assert versions.packages["deepspeed"].source == "installed"
    assert versions.get("deepspeed") is not None


def test_matches_agrees_with_packaging_specifiers():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from zeropilot.launch.versions import matches

    specs = [">=0.15", "<0.15.0", ">=4.46,<4.47.1", "==4.46.*", "!=5.6.0", "~=0.19.3", ">2.9", "<=1.9.0",
             ">=2.9,<2.10", "==0.16.0"]
    versions = ["0.14.2", "0.15.0", "0.16.0", "0.19.8", "4.46.0", "4.46.1", "4.47.0", "4.47.1", "5.6.0",
                "2.9.0", "2.9.1", "2.10.0", "1.9.0", "0.19.3", "0.20.0", "5.0.0rc1"]
    for spec in specs:
        for v in versions:
            assert matches(Version(v), spec) == (Version(v) in SpecifierSet(spec, prereleases=True)), (spec, v)
