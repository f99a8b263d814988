"""The agent: the multi-turn loop joining a generation engine and an environment, and its greedy evaluation."""
