"""One module per lab (labNN.py) registering that lab's graded questions."""
