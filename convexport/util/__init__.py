"""What every layer shares and that knows no graph: files written atomically, temporaries held
by their run, the steps told as they go, libraries kept quiet, the API's words for options."""
