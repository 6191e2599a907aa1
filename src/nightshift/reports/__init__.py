"""The report stage: report.json assembled from a finished run (``assemble``), its
arithmetic (``report``), the page (``page``), the chart (``chart``) and writing them
(``files``)."""
