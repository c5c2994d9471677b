"""Placeholder: filled in by the issue-35 work (routes of the messages API)."""

from __future__ import annotations

ROUTES: list = []
