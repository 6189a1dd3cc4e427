"""Capacity lab: replay a workload through the real RadixCache at many pool sizes and eviction
policies (no model), next to the infinite-capacity rate and the offline optimum; optionally check
the prediction on the real model. The sections live in radixui/panels/lab_*.py."""
import streamlit as st

from core.lab.page_trace import Overlap
from core.lab.units import fmt_capacity
from radixui.panels.lab_model import model_section
from radixui.panels.lab_planner import host_section, size_section
from radixui.panels.lab_routing import routing_section
from radixui.panels.lab_sweep import results_section, sweep_section
from radixui.panels.lab_workload import workload_section


def render() -> None:
    st.title("Capacity lab")
    st.caption("How much prefix-cache hit rate does each slot of KV pool buy, and which eviction policy should you "
               "use? The lab replays a workload through the same RadixCache the engine uses, without running the "
               "model, at every pool size and policy you pick, and draws the two bounds no policy can beat: an "
               "infinite pool and the offline optimum (Belady).")
    choice = workload_section()
    settings = sweep_section(choice)
    res = results_section(settings)
    # the planner: smallest pool by search, a host tier, routing over replicas
    workload, kv, signature = choice.workload, settings.kv, settings.signature
    st.divider()
    res_overlap = Overlap(**res.overlap) if res.overlap else None     # as the sweep ran, not as the widgets say now
    size_section(workload, res.policies, res.page_size, res_overlap, kv, settings.workers, signature)
    st.divider()
    host_section(workload, res, res_overlap, kv, signature)
    routing_section(workload, res.capacities, res.policies, res.page_size, res_overlap,
                    lambda c: fmt_capacity(c, res.page_size, kv), signature)
    model_section(workload, res)


if __name__ == "__main__":
    render()
