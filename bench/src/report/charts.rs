//! SVG charts (plotters): horizontal bars and a heat table. Deterministic for the same data.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// A chart to write: file name and SVG text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    /// File name (no directory).
    pub file: String,
    /// SVG document.
    pub svg: String,
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing chart: {e:?}")
}

const BAR: RGBColor = RGBColor(0x3b, 0x6e, 0xa8);

/// Horizontal bars, one per label, values on the x axis.
pub fn bars(
    file: &str,
    title: &str,
    x_desc: &str,
    labels: &[String],
    values: &[f64],
) -> Result<Chart> {
    let n = labels.len().min(values.len());
    let height = 90 + 28 * n as u32;
    let max = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let xmax = if max > 0.0 { max * 1.1 } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(300)
            .build_cartesian_2d(0f64..xmax, (0..n).into_segmented())
            .map_err(err)?;
        let fmt_label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&fmt_label)
            .x_desc(x_desc)
            .x_label_formatter(&|x| fmt_axis(*x))
            .draw()
            .map_err(err)?;
        // Rectangles in data order (plotters' Histogram series goes through a HashMap, whose
        // order, and so the SVG's bytes, changes from run to run).
        chart
            .draw_series(values.iter().take(n).enumerate().map(|(i, &v)| {
                let mut r = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v, SegmentValue::Exact(i + 1)),
                    ],
                    BAR.filled(),
                );
                r.set_margin(4, 4, 0, 0);
                r
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Chart {
        file: file.to_string(),
        svg,
    })
}

fn fmt_axis(x: f64) -> String {
    if x.abs() >= 1_000_000.0 {
        format!("{:.1}M", x / 1_000_000.0)
    } else if x.abs() >= 1_000.0 {
        format!("{:.0}k", x / 1_000.0)
    } else {
        format!("{x:.0}")
    }
}

/// A heat table: rows × columns of numbers (None: no data), shaded from white (0) to red (max).
pub fn heat_table(
    file: &str,
    title: &str,
    row_labels: &[String],
    col_labels: &[String],
    cells: &[Vec<Option<f64>>],
) -> Result<Chart> {
    let (label_w, cell_w, cell_h, top) = (170i32, 130i32, 34i32, 70i32);
    let width = (label_w + cell_w * col_labels.len() as i32 + 20).max(360) as u32;
    let height = (top + cell_h * row_labels.len() as i32 + 20) as u32;
    let max = cells
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let font = ("sans-serif", 14).into_font();
        root.draw(&Text::new(
            title.to_string(),
            (10, 10),
            ("sans-serif", 18).into_font(),
        ))
        .map_err(err)?;
        for (j, c) in col_labels.iter().enumerate() {
            let x = label_w + cell_w * j as i32 + 8;
            root.draw(&Text::new(c.clone(), (x, top - 22), font.clone()))
                .map_err(err)?;
        }
        for (i, r) in row_labels.iter().enumerate() {
            let y = top + cell_h * i as i32;
            root.draw(&Text::new(r.clone(), (10, y + 10), font.clone()))
                .map_err(err)?;
            for j in 0..col_labels.len() {
                let x = label_w + cell_w * j as i32;
                let v = cells.get(i).and_then(|row| row.get(j)).copied().flatten();
                let color = match v {
                    None => RGBColor(0xdd, 0xdd, 0xdd),
                    Some(v) => {
                        let t = if max > 0.0 {
                            (v / max).clamp(0.0, 1.0)
                        } else {
                            0.0
                        };
                        let fade = (255.0 * (1.0 - 0.75 * t)).round() as u8;
                        RGBColor(255, fade, fade)
                    }
                };
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell_w - 2, y + cell_h - 2)],
                    color.filled(),
                ))
                .map_err(err)?;
                let text = v.map_or("-".to_string(), |v| format!("{v:.0}"));
                root.draw(&Text::new(text, (x + 8, y + 10), font.clone()))
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(Chart {
        file: file.to_string(),
        svg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_deterministic_svg() {
        let l: Vec<String> = (0..12).map(|i| format!("bar {i}")).collect();
        let v: Vec<f64> = (0..12).map(|i| f64::from(i) * 10.0 + 1.0).collect();
        let a = bars("x.svg", "t", "rt/s", &l, &v).unwrap();
        for _ in 0..5 {
            assert_eq!(a, bars("x.svg", "t", "rt/s", &l, &v).unwrap());
        }
        let l = vec!["a".to_string(), "b".to_string()];
        let a = bars("x.svg", "t", "rt/s", &l, &[1.0, 2.0]).unwrap();
        assert!(a.svg.starts_with("<svg"));
        assert!(a.svg.contains("\na\n</text>"), "{}", a.svg);
    }

    #[test]
    fn heat_table_shows_values_and_gaps() {
        let c = heat_table(
            "h.svg",
            "loss",
            &["1,472".into()],
            &["w1".into(), "w16".into()],
            &[vec![Some(0.0), None]],
        )
        .unwrap();
        assert!(c.svg.contains("\n0\n</text>"), "{}", c.svg);
        assert!(c.svg.contains("\n-\n</text>"), "{}", c.svg);
    }
}
