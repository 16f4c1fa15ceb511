"""A CPU memory snapshot of a small Llama step (`gradscope run --memory-snapshot`) opened by
the functions of PyTorch's memory_viz that read a snapshot, from the project's pinned torch:
segsum, segments and memory (their flame-graph lines), trace and trace_plot.

Usage: memory_viz_test.py GRADSCOPE TEXT_FIXTURE. Exit 77 (skipped) without torch.
"""
import os
import pickle
import subprocess
import sys
import tempfile

try:
    from torch.cuda import _memory_viz as viz
except ImportError:
    print("no torch to read the snapshot with")
    sys.exit(77)


def lines(text):
    """memory_viz hands its flame-graph lines to flamegraph.pl, fetched from the web; here
    the lines themselves are read."""
    return text


def main():
    gradscope, text = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        snap = os.path.join(tmp, "step.pickle")
        subprocess.run(
            [gradscope, "run", "--model", "llama", "--preset", "small", "--seq", "64",
             "--batch", "2", "--steps", "1", "--warmup-steps", "1", "--threads", "1",
             "--dropout", "0", "--eval-batches", "1", "--sample-period", "0",
             "--dataset", text, "--quiet", "--no-db", "--json", os.path.join(tmp, "run.json"),
             "--memory-snapshot", snap],
            check=True)
        with open(snap, "rb") as f:
            data = pickle.load(f)

    summary = viz.segsum(data)  # checks every segment's blocks add up to it
    assert "total_allocated" in summary, summary
    trace = data["device_traces"][0]
    assert trace, "the snapshot holds no event"
    text = viz.trace(data)
    assert f"{len(trace)} entries" in text, text[:200]
    assert "TOTAL MEM" in text
    html = viz.trace_plot(data)
    assert "snapshot.pickle" in html

    # What the flame graphs would draw: one line per live block, its frames naming the
    # module and the component.
    flame = viz.segments(data, format_flamegraph=lines)
    memory = viz.memory(data, format_flamegraph=lines)
    assert flame.count("\n") == sum(len(s["blocks"]) for s in data["segments"])
    live = sum(s["total_size"] for s in data["segments"])
    assert sum(int(line.rsplit(" ", 1)[1]) for line in memory.splitlines()) == live
    for part in (":parameters", ":optimizer state"):
        assert part in memory, f"no {part[1:]} among the live blocks:\n{memory[:2000]}"
    names = {fr["name"] for e in trace for fr in e["frames"]}
    files = {fr["filename"] for e in trace for fr in e["frames"]}
    for part in ("activations in forward", "activations in backward", "logits in forward",
                 "gradients"):
        assert any(n.startswith(part) for n in names), f"no {part} in the trace"
    assert any(f.startswith("layers.") and f.endswith("/attention") for f in files), files
    # Every free of a block allocated in the trace frees its size.
    sizes = {}
    for e in trace:
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
        elif e["action"] == "free_completed" and e["addr"] in sizes:
            assert sizes.pop(e["addr"]) == e["size"], e
    print(f"memory_viz read {len(trace)} events, {len(data['segments'])} live blocks, "
          f"{live} bytes live at the end")


if __name__ == "__main__":
    main()
