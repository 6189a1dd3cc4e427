"""KV events: watch a production SGLang / vLLM prefix cache (or our server) through its KV event stream.

Subscribes to $RADIX_KV_EVENTS (or an address typed here), rebuilds the block tree from the
BlockStored / BlockRemoved / AllBlocksCleared batches, and draws it with the Live page's
figures; or replays a recording made with `python -m core.kv_events record`.
"""

import time

import streamlit as st

from core import env
from core.kv_events.follower import StreamFollower
from core.kv_events.recorder import read_recording
from core.kv_events.view import block_snapshot
from radixui.connect.kv_source import get_source
from radixui.connect.resources import DEFAULT_MODEL, get_runner
from radixui.figures.tree import Highlights, tree_figure, tree_overview
from radixui.panels.kv_link import BIND_HELP, unresolved_host, waiting_message
from radixui.panels.kv_panels import event_log_table, evictions_table, gap_panel, kpi_tiles, rates_figure, tiers_figure


def remember_in_url(params: dict) -> None:
    """Write the page's inputs into the query string (empty ones removed), only when they changed."""
    for key, value in params.items():
        if value and st.query_params.get(key) != value:
            st.query_params[key] = value
        elif not value and key in st.query_params:
            del st.query_params[key]


def render() -> None:
    st.title("KV events")
    st.caption("The prefix cache of an SGLang or vLLM deployment, rebuilt from the KV events it publishes "
               "(`--kv-events-config '{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\","
               "\"replay_endpoint\":\"tcp://*:5558\"}'`). Each block is one page of tokens under its parent block.")

    source = None
    mode = st.radio("Source", ["Live endpoint", "Recording"], horizontal=True, key="kv_mode")
    follower = None
    if mode == "Live endpoint":
        env_endpoint, env_replay, env_topic = env.kv_events()
        # the typed address lives in the URL too (?kv_endpoint=...), so a reload keeps it; "Bind here" does
        # not: a link must not make this machine listen (the subscriber is one for every tab, and what
        # connects to a bound socket feeds it), so a person ticks it in each session
        for key, default in (("kv_endpoint", env_endpoint), ("kv_replay", env_replay), ("kv_topic", env_topic)):
            if key not in st.session_state:
                st.session_state[key] = st.query_params.get(key, default or "")
        c1, c2, c3, c4 = st.columns([3, 3, 1, 1], vertical_alignment="bottom")
        endpoint = c1.text_input("Endpoint (the engine's PUB socket)", key="kv_endpoint", placeholder="tcp://HOST:5557")
        replay = c2.text_input("Replay endpoint (optional: catch up, fill gaps)", key="kv_replay",
                               placeholder="tcp://HOST:5558")
        topic = c3.text_input("Topic", key="kv_topic")
        bind = c4.checkbox("Bind here", key="kv_bind", help=BIND_HELP)
        remember_in_url({"kv_endpoint": endpoint.strip(), "kv_replay": replay.strip(), "kv_topic": topic,
                         "kv_bind": ""})       # removes the parameter from links made before it was ignored
        if not endpoint.strip():
            st.info("Type the engine's KV event address (or start the dashboard with RADIX_KV_EVENTS=tcp://HOST:5557).")
            st.stop()
        source, error = get_source(endpoint.strip(), replay.strip() or None, topic, bind)
        if error:
            st.error(error)
            st.stop()
        follower = source.follower
        live = st.toggle("Follow live", value=True, key="kv_live")
    else:
        path = st.text_input("Recording file", key="kv_path", placeholder="events.bin (from python -m core.kv_events record)")
        if not path.strip():
            st.info("Give the path of a recording to replay it here, batch by batch.")
            st.stop()
        errors: list = []
        try:
            frames = list(read_recording(path.strip(), errors))
        except ValueError as e:
            st.error(str(e))
            st.stop()
        for w in errors:
            st.warning(w)
        if not frames:
            st.warning("The recording holds no batches yet.")
            st.stop()
        upto = st.slider("After batch", 1, len(frames), len(frames), key="kv_upto") if len(frames) > 1 else 1
        follower = StreamFollower()
        for fr in frames[:upto]:
            gap = follower.offer(fr.seq, fr.payload, fr.topic)
            if gap is not None:
                follower.resolve(gap, [])
        live = False

    VIEWS = ["Block tree", "Events", "Evictions", "Tiers and rates"]
    decode = st.toggle(f"Decode tokens with this dashboard's model ({DEFAULT_MODEL})", value=False, key="kv_decode",
                       help="Right when the engine serves the same tokenizer (our server does); otherwise ids are shown")
    token_text = None
    if decode:
        try:
            tok = get_runner(DEFAULT_MODEL).tokenizer
            token_text = (lambda ids: tok.decode([t for t in ids if isinstance(t, int)])) if tok is not None else None
        except Exception as e:  # a model that does not load: ids it is
            st.warning(f"Could not load the tokenizer of {DEFAULT_MODEL!r} ({type(e).__name__}: {e}); showing token ids.")


    @st.fragment(run_every=1.0 if live else None)
    def views() -> None:
        with follower.lock:
            status = follower.status()
            stats = follower.tree.stats()
            view = block_snapshot(follower.tree, seq=status["last_seq"] or 0)
            media = follower.tree.media_counts()
            rate = follower.tree.rate()
            log = list(follower.tree.log)
            removals = list(follower.tree.removals)
            rates = list(follower.tree.rates)
            gaps = list(follower.gaps)
        waiting = None
        if source is not None:       # a live endpoint: nothing is "Exact" before a live batch came
            refused = source.link == "refused" and not source.bind and not source.received
            waiting = waiting_message(source.endpoint, source.bind, source.link, source.received,
                                      time.time() - source.started, status["last_seq"],
                                      unresolved_host(source.endpoint) if refused else None)
        if waiting is not None:
            getattr(st, waiting[0])(waiting[1])
        else:
            gap_panel(st, status, gaps, live=mode == "Live endpoint")
        kpi_tiles(st, stats, media, rate, status)
        choice = st.segmented_control("View", VIEWS, default=VIEWS[0], key="kv_view", label_visibility="collapsed") or VIEWS[0]
        if choice == "Block tree":
            if not view.cache.nodes[1:]:
                if waiting is None:
                    st.info("No blocks cached (yet). Send the engine a request.")
                return
            shape = st.radio("Draw", ["Tree", "Overview (sized by tokens)"], key="kv_shape", horizontal=True)
            hl = Highlights(inserted=view.inserted, evicted_nodes=view.evicted)
            if shape == "Tree":
                st.plotly_chart(tree_figure(view.cache, token_text, hl), width="stretch", key="kv_tree")
            else:
                st.plotly_chart(tree_overview(view.cache, token_text, hl), width="stretch", key="kv_overview")
            st.caption(("Decoded text." if token_text else "Token ids as the engine sent them.") + " Numbers under a node are its blocks (in order of first "
                       "store); the hover's last line gives its tiers. Green: stored by the latest batch.")
        elif choice == "Events":
            st.dataframe(event_log_table(log), hide_index=True, width="stretch", height=360)
        elif choice == "Evictions":
            df = evictions_table(removals)
            if df.empty:
                st.info("No block has been removed yet.")
            else:
                st.dataframe(df, hide_index=True, width="stretch", height=360)
        else:
            c1, c2 = st.columns(2)
            c1.plotly_chart(tiers_figure(media), width="stretch", key="kv_tiers")
            c2.plotly_chart(rates_figure(rates), width="stretch", key="kv_rates")


    views()


if __name__ == "__main__":
    render()
