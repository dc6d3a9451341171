"""torchzip: the torch-free reader sees exactly what torch.load sees, runs nothing, and falls back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from zeropilot.checkpoint import reconstruct, safe_load, torchzip
from zeropilot.checkpoint import safetensors_writer as stw
from zeropilot.checkpoint.layout import read_layout

from .conftest import FULL, LORA, zeropilot
from .test_safe_load import _Evil, _plant

pytestmark = pytest.mark.slow


def _raw(tensor):
    return tensor.reshape(-1).view(torch.uint8)


def _same(ours, theirs, where=""):
    """Walk both objects; returns how many tensors were compared byte for byte."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torchzip.StoredTensor), where
        assert (ours.dtype, ours.shape) == (str(theirs.dtype).replace("torch.", ""), tuple(theirs.shape)), where
        # bitwise: flat partitions end in alignment padding DeepSpeed never writes (torch.empty), NaN at times
        assert torch.equal(_raw(ours.to_torch()), _raw(theirs)), where
        blocks = b"".join(bytes(b) for b in ours.blocks(block_bytes=4096)) if theirs.numel() else b""
        assert blocks == theirs.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), where
        return 1
    if isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs), where
        return sum(_same(ours[k], v, f"{where}.{k}") for k, v in theirs.items())
    if isinstance(theirs, (list, tuple)):
        expected = tuple if isinstance(theirs, torch.Size) else type(theirs)  # torch.Size reads as a tuple
        assert type(ours) is expected and len(ours) == len(theirs), where
        return sum(_same(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(ours, theirs)))
    if isinstance(theirs, safe_load.DeepSpeedObject):
        assert type(ours) is type(theirs) and vars(ours) == vars(theirs), where
        return 0
    assert ours == theirs, where
    return 0


def test_every_file_of_real_checkpoints_reads_as_torch_load_reads_it(checkpoints):
    compared = 0
    for name in FULL + LORA:
        for f in read_layout(checkpoints(name).path).rank_files:
            compared += _same(torchzip.load(f.path), safe_load.load(f.path))
    assert compared > 300


def test_views_offsets_strides_and_dtypes(tmp_path):
    base = torch.arange(60, dtype=torch.float32).view(6, 10)
    saved = {"view": base[2:4], "col": base[:, 3], "half": torch.ones(5, dtype=torch.float16) * 3,
             "bf16": torch.randn(7).to(torch.bfloat16), "long": torch.arange(9), "flag": torch.tensor([True, False]),
             "param": torch.nn.Parameter(torch.randn(3, 2)), "size": torch.Size([4, 5]), "empty": torch.empty(0)}
    torch.save(saved, tmp_path / "f.pt")
    got = torchzip.load(tmp_path / "f.pt")
    assert got["view"].offset == got["col"].offset - 3 * 4 + 20 * 4  # both in one storage, 20 elements in
    assert got["view"].is_contiguous() and not got["col"].is_contiguous()
    assert got["size"] == (4, 5)
    for key in ("view", "half", "bf16", "long", "flag", "param", "empty"):
        assert torch.equal(got[key].to_torch(), saved[key].detach()), key
    with pytest.raises(torchzip.Unsupported, match="non-contiguous"):
        got["col"].flat()


def test_a_malicious_pickle_is_not_understood_and_nothing_runs(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "c")
    marker = tmp_path / "pwned"
    victim = _plant(path, marker)
    with pytest.raises(torchzip.Unsupported, match="system"):
        torchzip.load(victim)
    with pytest.raises(safe_load.UnsafePickleError):  # the fallback, torch's weights_only, refuses it too
        reconstruct.load_file(victim)
    assert not marker.exists()


def test_legacy_non_zip_files_are_refused_with_a_verdict_not_a_traceback(checkpoints, tmp_path):
    """torch < 1.6's format (no zip) is not read: inspect names the files, export stops with exit 2."""
    legacy = checkpoints("z3_w2_bf16_tied").copy(tmp_path / "legacy")
    for f in read_layout(legacy).rank_files:  # DeepSpeed is installed here: load its objects for real
        obj = torch.load(str(f.path), weights_only=False)
        torch.save(obj, str(f.path), _use_new_zipfile_serialization=False)
        with pytest.raises(torchzip.Unsupported, match="not a zip"):
            torchzip.load(f.path)
    inspect = zeropilot("ckpt", "inspect", legacy)
    assert inspect.returncode == 1 and "not written by torch.save" in inspect.stdout
    export = zeropilot("ckpt", "export", legacy, tmp_path / "out")
    assert export.returncode != 0 and "Traceback" not in export.stderr
    assert not (tmp_path / "out").exists()


def test_a_global_torch_allows_but_torchzip_does_not_know_falls_back(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "c")
    victim = read_layout(path).optim_file(1)
    obj = torch.load(str(victim), weights_only=False)
    obj["device"] = torch.device("cpu")  # a global (torch.device) in torch's own allowlist
    torch.save(obj, str(victim))
    with pytest.raises(torchzip.Unsupported, match="torch.device"):
        torchzip.load(victim)
    loaded = reconstruct.load_file(victim)
    assert loaded["device"] == torch.device("cpu")
    assert isinstance(loaded["optimizer_state_dict"]["single_partition_of_fp32_groups"][0],
                      reconstruct.LoadedTensor)
    result = zeropilot("ckpt", "export", path, tmp_path / "out", "--dtype", "fp32")
    assert result.returncode == 0, result.stderr


def test_fp32_export_and_inspect_never_import_torch(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").path
    code = ("import sys; from zeropilot.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    for args in (["ckpt", "export", str(path), str(tmp_path / "o"), "--dtype", "fp32", "--no-progress"],
                 ["ckpt", "inspect", str(path)]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "o" / "model.safetensors").stat().st_size > 0


@pytest.mark.parametrize("refuse", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_span_copy_falls_back_when_the_kernel_refuses(tmp_path, monkeypatch, refuse):
    """copy_file_range refuses across file systems on some kernels (EXDEV); sendfile, then read/write."""
    src = tmp_path / "src.bin"
    data = os.urandom(3 * stw._COPY_BLOCK // 2 + 17)
    src.write_bytes(data)

    def refused(*_args, **_kw):
        raise OSError(18, "Invalid cross-device link")

    for name in refuse:
        monkeypatch.setattr(os, name, refused)
    with open(tmp_path / "out.bin", "wb", buffering=0) as out:
        out.write(b"head")
        stw.copy_span(out, stw.FileSpan(str(src), 5, len(data) - 9))
    assert (tmp_path / "out.bin").read_bytes() == b"head" + data[5:-4]


def test_evil_class_is_what_torch_would_run(tmp_path):
    """Guard for the tests above: the planted object does run under weights_only=False."""
    marker = tmp_path / "ran"
    torch.save({"x": _Evil(marker)}, str(tmp_path / "e.pt"))
    with pytest.raises(torchzip.Unsupported):
        torchzip.load(tmp_path / "e.pt")
    assert not marker.exists()
    torch.load(str(tmp_path / "e.pt"), weights_only=False)
    assert marker.exists()


def test_a_file_with_a_non_contiguous_tensor_is_read_through_torch(tmp_path):
    """Pieces are byte ranges; a strided tensor (DeepSpeed writes none) takes the torch path instead."""
    base = torch.arange(12, dtype=torch.float32).view(3, 4)
    torch.save({"module": {"w": base.t()}}, tmp_path / "f.pt")
    assert not torchzip.load(tmp_path / "f.pt")["module"]["w"].is_contiguous()
    loaded = reconstruct.load_file(tmp_path / "f.pt")
    assert isinstance(loaded["module"]["w"], reconstruct.LoadedTensor)
    assert torch.equal(loaded["module"]["w"].flat().to_torch(), base.t().reshape(-1))


def test_parallel_crc32_equals_zlib_for_any_chunking(tmp_path):
    """Large records are hashed in chunks on several threads and joined with crc32_combine: same CRC as zlib."""
    import os
    import zlib

    from zeropilot.checkpoint.torchzip import crc32_combine, file_crc32

    data = os.urandom(30_001)  # chunk 1 makes 30,001 thread tasks and combines
    path = tmp_path / "blob"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for chunk in (1, 7, 4096, 65_536, 1 << 20):
            for offset, size in ((0, len(data)), (5, 29_990), (1234, 7_777), (10, 0)):
                assert file_crc32(fd, offset, size, chunk=chunk, workers=3) == zlib.crc32(data[offset:offset + size])
        with pytest.raises(EOFError):
            file_crc32(fd, 29_000, 5_000, chunk=1000)
    finally:
        os.close(fd)
    a, b = data[:1000], data[1000:]
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)


def test_an_enum_member_pickled_by_name_reads_as_safe_load_reads_it(tmp_path):
    """Python 3.11.2 writes ``getattr(ZeroStageEnum, 'optimizer_states')`` into every DeepSpeed optimizer file."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from .test_safe_load import _ByName

    torch.save({"zero_stage": _ByName(ZeroStageEnum, "gradients")}, str(tmp_path / "f.pt"))
    got = torchzip.load(tmp_path / "f.pt")["zero_stage"]
    assert int(got) == 2 == int(safe_load.load(tmp_path / "f.pt")["zero_stage"])
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "__class__")}, str(tmp_path / "g.pt"))
    with pytest.raises(torchzip.HostileFileError):
        torchzip.load(tmp_path / "g.pt")
