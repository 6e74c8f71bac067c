"""The CUDA caching allocator's own trace, kept small enough to commit as a test fixture.

Why this module exists: `torch.cuda.memory._record_memory_history()` makes the allocator
log every block it hands out and takes back, and every segment it gets from or returns to
the driver (cudaMalloc / cudaFree, or cuMemMap / cuMemUnmap with expandable segments).  A
trace recorded on a real GPU is therefore a GPU check that CI can run forever: replaying
its alloc/free sequence through mmguard's allocator model must give back the segments, and
so the reserved peak, that the real allocator produced (tests/alloc_trace).

The format is plain text, gzip-compressed, one event per line, no stacks:

    # mmguard-alloc-trace/1 {"id": ..., "torch_version": ..., ...}     (one header line)
    a ADDR SIZE STREAM DT        alloc: a block of SIZE bytes handed to a tensor
    f ADDR SIZE STREAM DT        free_completed: the block is back in the pool
    S ADDR SIZE STREAM DT        segment_alloc: cudaMalloc of SIZE bytes
    U ADDR SIZE STREAM DT        segment_free: cudaFree
    M ADDR SIZE STREAM DT        segment_map: expandable segment grew by SIZE bytes
    N ADDR SIZE STREAM DT        segment_unmap: expandable segment shrank
    O 0 SIZE STREAM DT           oom: an allocation of SIZE bytes failed

ADDR is hexadecimal, SIZE decimal bytes, STREAM the stream id torch reports, DT the
microseconds since the previous event.  'free_requested' is dropped: with one stream and
no record_stream() it is followed at once by 'free_completed', which is what returns the
block to the pool.  Pure Python (no torch), so CI reads fixtures without torch.
"""

import gzip
import json

FORMAT = "mmguard-alloc-trace/1"

ACTION_CODES = {
    "alloc": "a", "free_completed": "f", "segment_alloc": "S", "segment_free": "U",
    "segment_map": "M", "segment_unmap": "N", "oom": "O",
}
CODE_ACTIONS = {v: k for k, v in ACTION_CODES.items()}
IGNORED_ACTIONS = ("free_requested", "snapshot")


class TraceError(ValueError):
    """A trace file that is not in the format above (names the file and line)."""


def events_from_snapshot(snapshot, device=0):
    """(action, addr, size, stream, time_us) for the device's recorded events, in order."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    out = []
    for e in traces[device]:
        act = e.get("action")
        if act in IGNORED_ACTIONS:
            continue
        if act not in ACTION_CODES:
            raise TraceError("unknown allocator action %r in the snapshot" % act)
        out.append((act, int(e.get("addr") or 0), int(e.get("size") or 0),
                    int(e.get("stream") or 0), int(e.get("time_us") or 0)))
    return out


def segments_summary(snapshot):
    """What the allocator held when the snapshot was taken (sanity data for the header)."""
    segs = snapshot.get("segments") or []
    return {"segments": len(segs),
            "reserved_bytes": sum(int(s.get("total_size") or 0) for s in segs),
            "allocated_bytes": sum(int(s.get("allocated_size") or 0) for s in segs)}


def format_lines(events):
    prev_t = events[0][4] if events else 0
    for act, addr, size, stream, t in events:
        dt = max(0, t - prev_t)
        prev_t = t
        yield "%s %x %d %d %d\n" % (ACTION_CODES[act], addr, size, stream, dt)


def write_trace(path, events, meta):
    """Write events (from events_from_snapshot) and a meta dict as a gzip'ed trace."""
    head = dict(meta)
    head["events"] = len(events)
    head.update(replay_truth(events))
    with gzip.open(path, "wt", encoding="ascii", compresslevel=9) as f:
        f.write("# %s %s\n" % (FORMAT, json.dumps(head, sort_keys=True)))
        for line in format_lines(events):
            f.write(line)
    return head


def read_trace(path):
    """(meta, events) with events as (action, addr, size, stream, dt_us) tuples."""
    events = []
    meta = None
    with gzip.open(path, "rt", encoding="ascii") as f:
        for n, line in enumerate(f, 1):
            if n == 1:
                if not line.startswith("# " + FORMAT + " "):
                    raise TraceError("%s:1: not an %s file" % (path, FORMAT))
                try:
                    meta = json.loads(line[len(FORMAT) + 3:])
                except ValueError as e:
                    raise TraceError("%s:1: bad header JSON: %s" % (path, e))
                continue
            parts = line.split()
            if len(parts) != 5 or parts[0] not in CODE_ACTIONS:
                raise TraceError("%s:%d: expected 'CODE ADDR SIZE STREAM DT'" % (path, n))
            try:
                events.append((CODE_ACTIONS[parts[0]], int(parts[1], 16), int(parts[2]),
                               int(parts[3]), int(parts[4])))
            except ValueError:
                raise TraceError("%s:%d: bad number" % (path, n))
    if meta is None:
        raise TraceError("%s: empty trace" % path)
    return meta, events


def replay_truth(events):
    """What the real allocator did, read off the trace's own segment events: the reserved
    peak (bytes held from the driver), the allocated peak, and the counts.  This is the
    answer a replay of the alloc/free events through an allocator model must give."""
    reserved = allocated = 0
    peak_res = peak_alloc = 0
    live = {}
    n = {"alloc": 0, "segment_alloc": 0, "segment_map": 0, "oom": 0}
    for act, addr, size, _stream, _t in events:
        if act in ("segment_alloc", "segment_map"):
            reserved += size
            peak_res = max(peak_res, reserved)
        elif act in ("segment_free", "segment_unmap"):
            reserved -= size
        elif act == "alloc":
            live[addr] = size
            allocated += size
            peak_alloc = max(peak_alloc, allocated)
        elif act == "free_completed":
            allocated -= live.pop(addr, size)
        if act in n:
            n[act] += 1
    return {"truth_reserved_peak": peak_res, "truth_allocated_peak": peak_alloc,
            "truth_reserved_end": reserved, "truth_counts": n}
