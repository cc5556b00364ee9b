"""What only the book needs: the notebook conventions (setup cell, Colab link), plots, widgets,
and `make_learner`, which writes the learner notebooks."""
