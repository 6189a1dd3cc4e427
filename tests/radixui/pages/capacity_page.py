"""How the Capacity lab page's AppTest tests open the page, upload a trace and read errors and tables."""
from __future__ import annotations

import pathlib

from streamlit.testing.v1 import AppTest

APP = str(pathlib.Path(__file__).resolve().parents[3] / "app.py")
PAGE = "radixui/pages/capacity.py"


def open_page(timeout: float = 120) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def page_errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def result_frame(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def upload_trace(at: AppTest, name: str, data: bytes) -> None:
    at.radio(key="cap_source").set_value("Upload a trace")
    at.run()
    at.file_uploader(key="cap_upload").set_value((name, data, "application/json"))
    at.run()
