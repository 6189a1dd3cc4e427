"""`python -m core.kv_events`: record an engine's KV event stream, summarise it, turn it into a lab trace.

    python -m core.kv_events record --endpoint tcp://HOST:5557 [--replay tcp://HOST:5558] --out ev.bin
    python -m core.kv_events show ev.bin
    python -m core.kv_events convert ev.bin --out trace.jsonl
    python -m core.lab sweep --trace trace.jsonl ...        (the capacity lab reads the trace)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def _record(args) -> int:
    from core.kv_events.follower import StreamFollower
    from core.kv_events.recorder import Recorder
    from core.kv_events.subscriber import KVEventSubscriber, check_endpoint
    check_endpoint(args.endpoint)
    if args.replay:
        check_endpoint(args.replay, "replay endpoint")
    rec = Recorder(args.out)
    sub = KVEventSubscriber(args.endpoint, topic=args.topic, replay_endpoint=args.replay,
                            follower=StreamFollower(on_frame=rec, on_gap=rec.gap))
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    start = time.monotonic()
    held = None
    try:   # the line below says Ctrl-C works: print it inside the try that catches Ctrl-C
        print(f"recording {args.endpoint} (topic {args.topic!r}, replay {args.replay or 'none'}) to {args.out}; "
              f"Ctrl-C stops", file=sys.stderr)
        sub.start()
        if args.replay:
            sub.catch_up()
        last = 0.0
        while not stop["now"]:
            time.sleep(0.2)
            el = time.monotonic() - start
            if args.duration is not None and el >= args.duration:
                break
            if args.max_batches is not None and rec.frames >= args.max_batches:
                break
            if el - last >= 5:
                last = el
                _status(sub, rec)
    except KeyboardInterrupt:   # a second Ctrl-C must not break the close below (it raised while close()
        held = signal.signal(signal.SIGINT, signal.SIG_IGN)   # waited on a replay: traceback, exit -2)
    finally:
        sub.close()
        rec.close()
    if held is not None:
        signal.signal(signal.SIGINT, held)
    _status(sub, rec)
    return 0


def _status(sub, rec, shown: list = [0]) -> None:
    st = sub.follower.status()
    with sub.follower.lock:
        t = sub.follower.tree.stats()
    new, shown[0] = sub.errors[shown[0]:], len(sub.errors)   # each problem once
    # nothing listening at the endpoint looked like a quiet engine: "0 batches recorded" and nothing else
    link = f" · {sub.endpoint}: refused {sub.connect_retries} time(s), is the engine up?" \
        if sub.link == "refused" and not rec.frames else ""
    print(f"{rec.frames} batches recorded · {t['blocks']} blocks held · gaps {st['gaps']} "
          f"({st['unrecovered_gaps']} unrecovered, {st['missing_batches']} batches missing)"
          + link + "".join(f" · {e}" for e in new), file=sys.stderr)


def _show(args) -> int:
    from core.kv_events.recorder import replay_recording
    errors: list = []
    f = replay_recording(args.recording, errors=errors)
    out = {"stream": f.status(), "tree": f.tree.stats(), "media": f.tree.media_counts(),
           "gaps": [{k: v for k, v in g.as_dict().items() if k != "detected_ts"} for g in f.gaps],
           "warnings": errors}
    print(json.dumps(out, indent=2, default=str))
    return 0


def _convert(args) -> int:
    from core.kv_events.trace import convert_recording
    errors: list = []
    summary = convert_recording(args.recording, args.out, output_len=args.output_len, errors=errors,
                                merge_extensions=args.merge_extensions)
    print(json.dumps(dict(summary, warnings=errors), indent=2))
    if summary["extensions"]:
        what = ("appended to the request they extend (--merge-extensions)" if args.merge_extensions else
                "replayed as requests of their own, each hitting the whole prefix before it; if the traffic is "
                "single-turn, --merge-extensions appends them to the request they extend")
        n = summary["extensions"]
        print(f"{n:,} store{'s extend' if n != 1 else ' extends'} the last block of an earlier request: a request's "
              f"own output (SGLang and this engine cache it when the request finishes) or a chat's next turn; {what}",
              file=sys.stderr)
    skipped = summary["tier_copies"] + summary["other_groups"] + summary["orphans"]
    if skipped:
        print(f"not replayed: {summary['tier_copies']} tier copies (stores on CPU/disk tiers), "
              f"{summary['other_groups']} stores of other KV cache groups, {summary['orphans']} orphaned "
              f"stores (parent chain unknown): each request is counted once, from its device store",
              file=sys.stderr)
    if len(summary["block_sizes"]) == 1:
        print(f"the engine stored blocks of {summary['block_sizes'][0]} tokens: sweep this trace with --page-size "
              f"{summary['block_sizes'][0]}, as its cache matched whole blocks", file=sys.stderr)
    if summary["requests"] == 0:
        print("the recording holds no device-tier BlockStored with a known parent chain: nothing to replay"
              if skipped else "the recording holds no BlockStored events: nothing to replay", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.kv_events", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = p.add_subparsers(dest="cmd", required=True)
    r = sp.add_parser("record", help="subscribe to a KV event endpoint and record every batch to a file")
    r.add_argument("--endpoint", required=True, help="the engine's PUB address, e.g. tcp://10.0.0.5:5557")
    r.add_argument("--replay", default=None, help="its replay_endpoint (ROUTER), to fill gaps and catch up")
    r.add_argument("--topic", default="", help="topic prefix to subscribe to (default: all)")
    r.add_argument("--out", required=True, help="recording file to write")
    r.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    r.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")
    s = sp.add_parser("show", help="replay a recording and print the tree's figures and the gaps")
    s.add_argument("recording")
    c = sp.add_parser("convert", help="turn a recording into a capacity lab trace (JSONL of token ids)")
    c.add_argument("recording")
    c.add_argument("--out", required=True)
    c.add_argument("--output-len", type=int, default=0, help="output tokens per request (events do not say)")
    c.add_argument("--merge-extensions", action="store_true",
                   help="append a store under the last block of an earlier request to that request (its output, "
                        "stored when it finished) instead of replaying it as a request: for single-turn traffic")
    args = p.parse_args(argv)
    try:
        return {"record": _record, "show": _show, "convert": _convert}[args.cmd](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:         # `show ... | head`: the reader has what it wanted; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's own flush at exit would fail too
        return 0


if __name__ == "__main__":
    sys.exit(main())
