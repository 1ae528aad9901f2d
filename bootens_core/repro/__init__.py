"""The reproduction of the paper, apart from the library: experiment configurations and profiles
(:mod:`~bootens_core.repro.config`), the experiments behind every chapter
(:mod:`~bootens_core.repro.experiments`), the UCI cell harness and cell packs (:mod:`~bootens_core.repro.harness`,
:mod:`~bootens_core.repro.cellpack`), the result store (:mod:`~bootens_core.repro.store`), the book's tables and
verdicts (:mod:`~bootens_core.repro.report`) and figures (:mod:`~bootens_core.repro.plots`), the performance
chapter's benchmark and profile (:mod:`~bootens_core.repro.performance`) and the ``bootens`` command
(:mod:`~bootens_core.repro.cli`). Nothing in the library imports from here."""
