"""What a run leaves behind: failures named by rule, results files, replay files."""
