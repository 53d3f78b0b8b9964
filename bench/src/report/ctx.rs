//! The renderers' shared state: the inputs, and the sections, charts and refusals built so far.

use super::charts::Chart;
use super::{Input, Inputs, Rendered};
use crate::schema::ResultFile;

/// The renderers' shared state: the inputs, and the output and refusals built so far.
pub(super) struct Ctx<'a> {
    pub(super) inputs: &'a Inputs,
    chart_dir: &'a str,
    out: Rendered,
    pub(super) refused: Vec<(String, String)>,
}

impl<'a> Ctx<'a> {
    /// A context over `inputs`, its charts linked under `chart_dir`.
    pub(super) fn new(inputs: &'a Inputs, chart_dir: &'a str) -> Self {
        Ctx {
            inputs,
            chart_dir,
            out: Rendered::default(),
            refused: inputs.refused.clone(),
        }
    }

    /// The newest input `pick` takes (inputs are in sorted path order, so the last one),
    /// with its path: a part that shows one sitting renders its newest file.
    pub(super) fn newest(
        &self,
        pick: impl Fn(&Input) -> Option<&serde_json::Value>,
    ) -> Option<(String, serde_json::Value)> {
        self.inputs
            .files
            .iter()
            .rev()
            .find_map(|(p, i)| pick(i).map(|v| (p.clone(), v.clone())))
    }

    /// Links the charts of the sections that follow from `dir` (the page's own directory).
    pub(super) fn set_chart_dir(&mut self, dir: &'a str) {
        self.chart_dir = dir;
    }

    /// The sections and charts rendered.
    pub(super) fn finish(self) -> Rendered {
        self.out
    }

    /// Adds a section (in document order).
    pub(super) fn section(&mut self, name: &str, body: String) {
        self.out.order.push(name.to_string());
        self.out.sections.insert(name.to_string(), body);
    }

    /// Keeps a chart and returns its markdown image link.
    pub(super) fn chart(&mut self, c: Chart, alt: &str) -> String {
        let link = format!("![{alt}]({}/{})\n", self.chart_dir, c.file);
        self.out.charts.insert(c.file, c.svg);
        link
    }

    pub(super) fn bench_files(&self, kinds: &[&str]) -> Vec<(&str, &ResultFile)> {
        self.inputs
            .files
            .iter()
            .filter_map(|(p, i)| match i {
                Input::Bench(f) if kinds.contains(&f.kind.as_str()) => Some((p.as_str(), f)),
                _ => None,
            })
            .collect()
    }
}
