"""The floor of a new tab: a Streamlit page with a title and one small Plotly chart, nothing else.
Opening it costs what any such dashboard costs a browser with nothing cached (Streamlit's and
plotly.js's JavaScript, a websocket, one chart); tests/e2e/test_dashboard.py opens it side by side
with the Live page, so the Live page's warm start is judged by what it adds, not by the box's speed."""
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="Bare page", layout="wide", initial_sidebar_state="collapsed")
st.title("Bare page")
st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2])), key="bare", config={"displayModeBar": False})
