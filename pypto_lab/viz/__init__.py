"""The last stage of the data path: what a user sees. Matplotlib views (`views`), ipywidgets
explorers (`widgets`) and the tour's HTML report (`tour_report`). They draw only what the
simulator reported."""
