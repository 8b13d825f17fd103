//! results.json and callgrind.json: what a run measured, every run's raw
//! figures kept, with the medians, min–max and ratios against tlmalloc.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocators::{AllocatorInfo, Skipped};
use crate::runner::ResultLine;
use crate::stats::{ratio, summarize, Summary};
use crate::sysinfo::Machine;
use crate::workloads::{Budget, METRICS};

pub const SCHEMA: u32 = 1;

/// One workload × allocator × threads × parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub workload: String,
    pub allocator: String,
    pub threads: usize,
    /// `size=64`, `op=malloc`, `mode=larson`, or empty.
    pub param: String,
    /// Every run's raw figures, in run order.
    pub runs: Vec<BTreeMap<String, f64>>,
    /// Per figure: median, min, max over the runs, and the ratio of the
    /// median to tlmalloc's.
    pub summary: BTreeMap<String, Summary>,
}

/// A run that produced no figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub workload: String,
    pub allocator: String,
    pub threads: usize,
    pub run: usize,
    pub error: String,
}

/// How to read a figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricInfo {
    pub label: String,
    pub unit: String,
    pub higher_is_better: bool,
    /// The raw value is divided by this for display (KiB → MiB).
    pub divisor: f64,
}

/// All of results.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema: u32,
    pub date: String,
    pub command: String,
    pub budget: Budget,
    pub runs: usize,
    pub threads: Vec<usize>,
    pub workloads: Vec<String>,
    pub machine: Machine,
    pub allocators: Vec<AllocatorInfo>,
    pub skipped: Vec<Skipped>,
    /// Workloads that could not run on this machine, with the reason
    /// (`cpython` without `python3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_workloads: Vec<Skipped>,
    pub records: Vec<Record>,
    pub failures: Vec<Failure>,
    pub metrics: BTreeMap<String, MetricInfo>,
    pub seconds: f64,
}

impl Results {
    pub fn metric_table() -> BTreeMap<String, MetricInfo> {
        METRICS
            .iter()
            .map(|m| {
                (
                    m.key.to_string(),
                    MetricInfo {
                        label: m.label.to_string(),
                        unit: m.unit.to_string(),
                        higher_is_better: m.higher_is_better,
                        divisor: m.divisor,
                    },
                )
            })
            .collect()
    }

    /// The record of (workload, allocator, threads, param).
    pub fn record(
        &self,
        workload: &str,
        allocator: &str,
        threads: usize,
        param: &str,
    ) -> Option<&Record> {
        self.records.iter().find(|r| {
            r.workload == workload
                && r.allocator == allocator
                && r.threads == threads
                && r.param == param
        })
    }

    /// The allocator names with records, in the order they were run.
    pub fn allocator_names(&self) -> Vec<String> {
        self.allocators.iter().map(|a| a.name.clone()).collect()
    }

    /// The (threads, param) pairs of a workload, in the order measured.
    pub fn cases(&self, workload: &str) -> Vec<(usize, String)> {
        let mut cases: Vec<(usize, String)> = Vec::new();
        for r in self.records.iter().filter(|r| r.workload == workload) {
            let key = (r.threads, r.param.clone());
            if !cases.contains(&key) {
                cases.push(key);
            }
        }
        cases
    }
}

/// Collects result lines into records as runs come in.
#[derive(Default)]
pub struct Collector {
    records: Vec<Record>,
}

impl Collector {
    /// Add one run's result lines, measured under `allocator`.
    pub fn add(&mut self, allocator: &str, lines: Vec<ResultLine>) {
        for line in lines {
            let pos = self.records.iter().position(|r| {
                r.workload == line.workload
                    && r.allocator == allocator
                    && r.threads == line.threads
                    && r.param == line.param
            });
            let record = match pos {
                Some(i) => &mut self.records[i],
                None => {
                    self.records.push(Record {
                        workload: line.workload,
                        allocator: allocator.to_string(),
                        threads: line.threads,
                        param: line.param,
                        runs: Vec::new(),
                        summary: BTreeMap::new(),
                    });
                    self.records.last_mut().expect("just pushed")
                }
            };
            record.runs.push(line.metrics);
        }
    }

    /// The records with their summaries and ratios against tlmalloc.
    pub fn finish(self) -> Vec<Record> {
        finish_records(self.records)
    }
}

/// Fill in every record's summary (median, min, max) and each median's
/// ratio to tlmalloc's median of the same workload, threads, parameter
/// and figure.
pub fn finish_records(mut records: Vec<Record>) -> Vec<Record> {
    for r in &mut records {
        let mut keys: Vec<&String> = r.runs.iter().flat_map(|m| m.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut summary = BTreeMap::new();
        for key in keys {
            let values: Vec<f64> = r.runs.iter().filter_map(|m| m.get(key).copied()).collect();
            if let Some(s) = summarize(&values) {
                summary.insert(key.clone(), s);
            }
        }
        r.summary = summary;
    }
    let bases: Vec<(String, usize, String, BTreeMap<String, f64>)> = records
        .iter()
        .filter(|r| r.allocator == "tlmalloc")
        .map(|r| {
            let medians = r
                .summary
                .iter()
                .map(|(k, s)| (k.clone(), s.median))
                .collect();
            (r.workload.clone(), r.threads, r.param.clone(), medians)
        })
        .collect();
    for r in &mut records {
        let base = bases
            .iter()
            .find(|(w, t, p, _)| *w == r.workload && *t == r.threads && *p == r.param);
        if let Some((_, _, _, medians)) = base {
            for (key, s) in r.summary.iter_mut() {
                s.vs_tlmalloc = medians.get(key).and_then(|&b| ratio(s.median, b));
            }
        }
    }
    records
}

/// One row of the instruction counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallgrindRow {
    pub allocator: String,
    pub size: usize,
    /// Total instructions of `pair SIZE iters_a` and `pair SIZE iters_b`.
    pub ir_a: u64,
    pub ir_b: u64,
    /// (ir_b − ir_a) / (iters_b − iters_a).
    pub raw_per_pair: f64,
    /// The same for the empty loop.
    pub empty_per_iter: f64,
    /// raw − empty: instructions of one malloc+free pair.
    pub net_per_pair: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vs_tlmalloc: Option<f64>,
}

/// All of callgrind.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallgrindResults {
    pub schema: u32,
    pub date: String,
    pub command: String,
    pub valgrind: String,
    pub iters: (u64, u64),
    pub machine: Machine,
    pub allocators: Vec<AllocatorInfo>,
    pub skipped: Vec<Skipped>,
    pub rows: Vec<CallgrindRow>,
    pub failures: Vec<Failure>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(workload: &str, threads: usize, param: &str, m: &[(&str, f64)]) -> ResultLine {
        ResultLine {
            workload: workload.into(),
            threads,
            param: param.into(),
            metrics: m.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn runs_are_grouped_and_compared_with_tlmalloc() {
        let mut c = Collector::default();
        for (run, (tl, gl)) in [(10.0, 5.0), (12.0, 6.0), (11.0, 4.0)]
            .into_iter()
            .enumerate()
        {
            c.add(
                "tlmalloc",
                vec![line(
                    "fixed",
                    1,
                    "",
                    &[("mops", tl), ("peak_rss_kib", 1000.0)],
                )],
            );
            c.add(
                "glibc",
                vec![line(
                    "fixed",
                    1,
                    "",
                    &[("mops", gl), ("peak_rss_kib", 2000.0 + run as f64)],
                )],
            );
        }
        c.add("glibc", vec![line("fixed", 2, "", &[("mops", 9.0)])]);
        let records = c.finish();
        assert_eq!(records.len(), 3);
        let tl = &records[0];
        assert_eq!((tl.allocator.as_str(), tl.runs.len()), ("tlmalloc", 3));
        assert_eq!(tl.summary["mops"].median, 11.0);
        assert_eq!(tl.summary["mops"].vs_tlmalloc, Some(1.0));
        let gl = &records[1];
        assert_eq!(gl.summary["mops"].median, 5.0);
        assert_eq!((gl.summary["mops"].min, gl.summary["mops"].max), (4.0, 6.0));
        assert_eq!(gl.summary["mops"].vs_tlmalloc, Some(5.0 / 11.0));
        assert_eq!(gl.summary["peak_rss_kib"].vs_tlmalloc, Some(2.001));
        // No tlmalloc record for two threads: no ratio.
        assert_eq!(records[2].summary["mops"].vs_tlmalloc, None);
        // The raw figures of every run are kept.
        assert_eq!(gl.runs[2]["mops"], 4.0);
    }
}
