"""Replicas: every engine the dashboard is attached to, side by side (RADIX_ENGINE_URL=a,b,...).

One tree per replica, per-replica and total KPIs, and which replica served each request: what a
router such as sglang-router did with the traffic (`python -m core.replicas` starts one)."""
import streamlit as st

from radixui.connect.resources import engine_urls, get_clients
from radixui.figures.kpis import kpi_line, sglang_status
from radixui.figures.replicas_table import request_rows, total_metrics
from radixui.figures.tree import tree_figure
from radixui.panels.live_data import decoder
from radixui.panels.css import COMPACT_CSS


def render() -> None:
    st.markdown(COMPACT_CSS, unsafe_allow_html=True)   # the KPI line's styles, as on the Live page
    st.title("Replicas")
    clients = get_clients()
    names = engine_urls() or ["this process"]
    if len(clients) < 2:
        st.info("Attached to one engine. To watch several replicas, start them behind SGLang's router with "
                "`python -m core.replicas --replicas 2` and attach the dashboard to every server: "
                "`RADIX_ENGINE_URL=http://127.0.0.1:30001,http://127.0.0.1:30002 make run`.")
    live = st.sidebar.toggle("Live refresh", value=True, key="rep_live")


    @st.fragment(run_every=1.0 if live else None)
    def body() -> None:
        snaps, errors = [], []
        for name, c in zip(names, clients):
            try:
                snaps.append(c.snapshot())
            except (ConnectionError, RuntimeError) as exc:
                snaps.append(None)
                errors.append(f"{name}: {exc}")
        for e in errors:
            st.warning(f"A replica does not answer: {e}")
        total = total_metrics(snaps)
        who = "One engine" if len(clients) == 1 else f"All {len(clients)} replicas"
        st.markdown(f"**{who}** · {int(total['prompt_tokens']):,} prompt tokens, "
                    f"{int(total['cached_tokens']):,} from cache ({total['hit_rate']:.1%}) · "
                    f"{int(total['running'])} running, {int(total['waiting'])} waiting · token usage "
                    f"{total['token_usage']:.2f}")
        figs = st.session_state.setdefault("_rep_figs", {})
        c_of = dict(zip(names, clients))
        per_row = min(len(clients), 3)
        for start in range(0, len(clients), per_row):
            cols = st.columns(per_row)
            for col, name, snap in zip(cols, names[start:start + per_row], snaps[start:start + per_row]):
                with col:
                    st.markdown(f"**{name}**")
                    if snap is None:
                        st.caption("no answer")
                        continue
                    st.markdown(kpi_line(snap.metrics, snap.step), unsafe_allow_html=True)
                    st.caption(sglang_status(snap.metrics))
                    key = (name, snap.seq, snap.step)
                    if figs.get(name, (None,))[0] != key:      # rebuild a tree only when its replica changed
                        # the Live page's byte-level decoder: joining per-token pieces garbles
                        # every character BPE splits over two tokens ("東" -> "��")
                        tt = decoder(st.session_state, c_of[name], snap, f"replica {name}")
                        figs[name] = (key, tree_figure(snap.cache, tt, width=440, height=420))
                    st.plotly_chart(figs[name][1], width="stretch", key=f"rep_tree_{start}_{name}")
        st.markdown("**Requests** (which replica served each)")
        st.dataframe(request_rows(snaps, names), hide_index=True, width="stretch", height=260)


    body()


if __name__ == "__main__":
    render()
