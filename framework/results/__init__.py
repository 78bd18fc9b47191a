"""What a sweep leaves: trial and request rows and their schemas (`rows`), the Parquet store
(`store`), provenance, the diagnosis of a trial, the console output (`console`), the HTML
report and `status` / `best`. The only room that imports pyarrow and pandas."""
