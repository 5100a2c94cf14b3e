"""Plots (functions that return matplotlib Figures) and lazy ipywidgets controls.

matplotlib and ipywidgets are imported inside the functions, never at import time.
"""
