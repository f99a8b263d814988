"""Models: loading weights, prompts, the RM judge, the environment model's rewriters, precision; the
generation engines (engines/) and training (training/) in rooms of their own."""
