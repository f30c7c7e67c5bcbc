"""Wiring: settings, the Faust app, its command line and web views."""
