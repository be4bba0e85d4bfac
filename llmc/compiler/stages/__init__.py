"""The target-independent stages of ``llmc build``, each a function of the previous stage's
typed artifact (a backend's own follow: ``llmc.compiler.backends.protocol``).

    load.resolve       SourceOptions -> ResolvedModel        (files, tokenizer, digest)
    load.load          ResolvedModel -> LoadedModel          (float32 weights, KV geometry)
    export.export      LoadedModel -> FloatGraph             (plugin nodes, graph passes)
    quantize.quantize  FloatGraph -> EngineGraph             (Q/DQ nodes, with --quant)
    Backend.lower      EngineGraph -> LoweredEngine          (the target's engine files)
    Backend.report     LoweredEngine -> EngineReport         (what the backend measures)
    manifest           ... -> manifest.json                  (``core_facts``: shared fields)
    publish.publish    engine directory -> IndexEntry        (with --registry)

``llmc.compiler.build`` runs them in order for every backend.
"""
