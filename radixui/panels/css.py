"""CSS that makes the Live page fit one 1400x900 screen: less padding above the title, a smaller
title, KPIs as one line of chips (they wrap only on a narrower screen), SGLang's status line never
wrapping (cut with "…" on a narrow one; its title holds it whole)."""

COMPACT_CSS = """
<style>
/* form buttons: room for the whole label ("Run preset" beside the preset picker, sidebar open) */
[data-testid="stForm"] button[data-testid^="stBaseButton"] {padding-left: 0.3rem; padding-right: 0.3rem;}
[data-testid="stForm"] button[data-testid^="stBaseButton"] p {white-space: nowrap; text-overflow: clip;}
[data-testid="stMainBlockContainer"] {padding-top: 3rem; padding-bottom: 1rem;}
h1 {font-size: 1.55rem !important; padding: 0 0 0.1rem 0 !important;}
.kpi-line {display: flex; flex-wrap: wrap; gap: 0.25rem 0.32rem; font-size: 0.76rem; line-height: 1.45;}
.kpi {background: #f3f4f6; border-radius: 0.4rem; padding: 0.02rem 0.32rem; white-space: nowrap;}
.kpi-l {color: #4b5563;}
.kpi-v {color: #111827;}
.kpi-step {background: none; color: #6b7280;}
.sglang {font-family: monospace; font-size: 0.74rem; color: #374151; white-space: nowrap; overflow: hidden;
         text-overflow: ellipsis; max-width: 100%;}
</style>
"""
