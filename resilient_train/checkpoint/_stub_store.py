# TEMPORARY local-only stub so the runner can be exercised before store.py lands. Not committed.
from __future__ import annotations
import hashlib, json, shutil, os
from pathlib import Path
from resilient_train.checkpoint.manifest import Manifest, FileEntry, SCHEMA_VERSION, now_utc, sha256_file

class CheckpointStore:
    def __init__(self, url, storage_options=None, **kw):
        self.url = str(url).rstrip("/"); self.root = Path(self.url)
    @staticmethod
    def dir_name(gs): return f"ckpt-{gs:012d}"
    def check(self): self.root.mkdir(parents=True, exist_ok=True)
    def commit(self, local_dir, *, run_id, epoch, step_in_epoch, global_step, world_size, weights_sha256, tf_version, extra=None):
        d = self.root / self.dir_name(global_step); d.mkdir(parents=True, exist_ok=True)
        files = {}
        for p in sorted(Path(local_dir).rglob("*")):
            if p.is_file():
                rel = p.relative_to(local_dir).as_posix(); shutil.copyfile(p, d / rel); files[rel] = sha256_file(p)
        m = Manifest(SCHEMA_VERSION, run_id, epoch, step_in_epoch, global_step, world_size, tf_version, now_utc(), files, weights_sha256, extra or {})
        (d / "MANIFEST.json").write_text(m.to_json()); return m
    def _manifests(self):
        out = []
        for d in sorted(self.root.glob("ckpt-*")):
            try: out.append(Manifest.from_json((d / "MANIFEST.json").read_text(), path=str(d)))
            except Exception: pass
        return out
    def latest_manifest(self):
        ms = self._manifests(); return ms[-1] if ms else None
    def fetch(self, gs, cache_dir):
        src = self.root / self.dir_name(gs); dst = Path(cache_dir) / self.dir_name(gs)
        shutil.rmtree(dst, ignore_errors=True); shutil.copytree(src, dst)
        return Manifest.from_json((dst / "MANIFEST.json").read_text(), path=str(dst)), dst
    def restore_latest(self, cache_dir):
        m = self.latest_manifest(); return self.fetch(m.global_step, cache_dir) if m else None
    def retain(self, keep):
        ms = self._manifests()
        for m in ms[:-keep]: shutil.rmtree(self.root / self.dir_name(m.global_step))
        return []
    def collect_garbage(self): return []
