"""`hvd-dynbatch plot` draws a metrics file to a PNG, and refuses one with nothing to draw."""
import json
import subprocess

from hvd_dynbatch.launch import local_env
from launcher import CLI


def write_metrics(path, steps):
    records = [{"step": s, "epoch": 0, "time": 0.01 * s, "world_size": 2 if s < 20 else 3,
                "global_batch": 64, "batch_sizes": [32 + s % 5, 32 - s % 5] + ([10] if s >= 20
                                                                               else []),
                "compute_times": [0.01, 0.012] + ([0.02] if s >= 20 else []),
                "step_time": 0.013, "lr": 0.05 + 0.001 * s, "loss": 2.0 / (1 + s)}
               for s in range(40)]
    records.insert(20, {"type": "reset", "step": 20, "world_size": 3})
    records.append({"type": "eval", "step": 40, "time": 0.4, "accuracy": 0.8})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_writes_a_png(tmp_path):
    metrics, png = tmp_path / "m.jsonl", tmp_path / "out.png"
    write_metrics(metrics, 40)
    out = subprocess.run([*CLI, "plot", str(metrics), "-o", str(png), "--title", "t"],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plot_of_a_file_without_steps_is_a_clear_error(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"type": "summary"}) + "\n")
    out = subprocess.run([*CLI, "plot", str(metrics), "-o", str(tmp_path / "x.png")],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no per-step records" in out.stderr
    assert "Traceback" not in out.stderr


def test_plot_of_several_files_compares_them(tmp_path):
    paths = [tmp_path / "static.jsonl", tmp_path / "dynamic.jsonl"]
    for path, steps in zip(paths, (30, 40)):
        write_metrics(path, steps)
    png = tmp_path / "cmp.png"
    out = subprocess.run([*CLI, "plot", *map(str, paths), "-o", str(png)],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
