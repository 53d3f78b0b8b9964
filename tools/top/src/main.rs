//! `ricochet-top ADDR`: a live view of a Ricochet server's metrics endpoint
//! (`ServerConfig::metrics`): its workers (load, datagrams/s, drops/s, tick lateness) and its
//! sessions (sorted by RTT or loss, sparklines of the selected one's RTT, loss and bandwidth),
//! refreshed every second.
//!
//! Keys: `r` sort by RTT, `l` sort by loss, `↑`/`↓` (or `k`/`j`) select, `q` (or Esc) quit.

mod data;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, Table, TableState};
use ratatui::{DefaultTerminal, Frame};

use data::{Sample, Session, WorkerRates};

/// Points of history kept per session for its sparklines (one a second).
const HISTORY: usize = 120;
const REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortBy {
    Rtt,
    Loss,
}

/// One second of a session: RTT (µs), loss (per mille over the interval), bytes/s.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    rtt_us: u64,
    loss_permille: u64,
    bytes_per_sec: u64,
}

struct App {
    addr: SocketAddr,
    sort: SortBy,
    table: TableState,
    last: Option<Sample>,
    workers: Vec<WorkerRates>,
    sessions: Vec<Session>,
    history: HashMap<String, VecDeque<Point>>,
    error: Option<String>,
}

impl App {
    fn refresh(&mut self) {
        match data::fetch(self.addr) {
            Ok(sample) => {
                self.error = None;
                if let Some(prev) = &self.last {
                    self.workers = data::rates(prev, &sample);
                    for s in &sample.sessions {
                        let before = prev.sessions.iter().find(|p| p.id == s.id);
                        let dt = sample.at.duration_since(prev.at).as_secs_f64().max(1e-3);
                        let point = Point {
                            rtt_us: s.rtt_us,
                            loss_permille: before.map_or(0, |b| {
                                let sent = s.packets_sent.saturating_sub(b.packets_sent);
                                let lost = s.packets_lost.saturating_sub(b.packets_lost);
                                lost * 1000 / sent.max(1)
                            }),
                            bytes_per_sec: before.map_or(0, |b| {
                                let bytes = (s.bytes_sent + s.bytes_received)
                                    .saturating_sub(b.bytes_sent + b.bytes_received);
                                (bytes as f64 / dt) as u64
                            }),
                        };
                        let h = self.history.entry(s.id.clone()).or_default();
                        if h.len() == HISTORY {
                            h.pop_front();
                        }
                        h.push_back(point);
                    }
                } else {
                    self.workers = data::rates(&sample, &sample);
                }
                self.history
                    .retain(|id, _| sample.sessions.iter().any(|s| &s.id == id));
                self.sessions = sample.sessions.clone();
                self.last = Some(sample);
                self.sort_sessions();
            }
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }

    fn sort_sessions(&mut self) {
        let selected = self
            .table
            .selected()
            .and_then(|i| self.sessions.get(i))
            .map(|s| s.id.clone());
        match self.sort {
            SortBy::Rtt => self.sessions.sort_by_key(|s| std::cmp::Reverse(s.rtt_us)),
            SortBy::Loss => self.sessions.sort_by(|a, b| b.loss().total_cmp(&a.loss())),
        }
        let i = selected
            .and_then(|id| self.sessions.iter().position(|s| s.id == id))
            .or((!self.sessions.is_empty()).then_some(0));
        self.table.select(i);
    }

    fn draw(&mut self, f: &mut Frame) {
        let [head, workers, sessions, sparks] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(self.workers.len() as u16 + 3),
            Constraint::Min(5),
            Constraint::Length(9),
        ])
        .areas(f.area());
        let sort = match self.sort {
            SortBy::Rtt => "rtt",
            SortBy::Loss => "loss",
        };
        let status = match &self.error {
            Some(e) => format!("ricochet-top {}  ERROR: {e}", self.addr),
            None => format!(
                "ricochet-top {}  sessions {}  sort: {sort}  (r: rtt, l: loss, ↑↓: select, q: quit)",
                self.addr,
                self.last.as_ref().map_or(0, |s| s.total_sessions)
            ),
        };
        f.render_widget(Paragraph::new(status), head);

        let rows = self.workers.iter().map(|w| {
            Row::new(vec![
                format!("worker {}", w.worker),
                format!("{:.0}%", w.busy * 100.0),
                w.sessions.to_string(),
                format!("{:.0}", w.datagrams_in_per_sec),
                format!("{:.0}", w.datagrams_out_per_sec),
                format!("{:.1}", w.drops_per_sec),
                format!("{:.2} ms", w.tick_lateness_ms),
            ])
        });
        let table = Table::new(
            rows,
            [
                Constraint::Length(10),
                Constraint::Length(6),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(10),
                Constraint::Length(8),
                Constraint::Length(12),
            ],
        )
        .header(
            Row::new([
                "worker",
                "load",
                "sessions",
                "dgram in/s",
                "dgram out/s",
                "drops/s",
                "tick late",
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(Block::new().borders(Borders::ALL).title("workers"));
        f.render_widget(table, workers);

        let rows = self.sessions.iter().map(|s| {
            Row::new(vec![
                s.id.clone(),
                s.addr.clone(),
                format!("{:.1} ms", s.rtt_us as f64 / 1000.0),
                format!("{:.2}%", s.loss() * 100.0),
                s.bytes_sent.to_string(),
                s.bytes_received.to_string(),
            ])
        });
        let table = Table::new(
            rows,
            [
                Constraint::Length(20),
                Constraint::Length(22),
                Constraint::Length(10),
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(12),
            ],
        )
        .header(
            Row::new(["session", "address", "rtt", "loss", "bytes out", "bytes in"])
                .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .block(
            Block::new()
                .borders(Borders::ALL)
                .title(format!("sessions (by {sort})")),
        );
        f.render_stateful_widget(table, sessions, &mut self.table);

        let selected = self.table.selected().and_then(|i| self.sessions.get(i));
        let history: Vec<Point> = selected
            .and_then(|s| self.history.get(&s.id))
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default();
        let [a, b, c] = Layout::vertical([Constraint::Length(3); 3]).areas(sparks);
        let title = |what: &str| {
            let who = selected.map_or("no session".to_string(), |s| s.id.clone());
            Line::from(format!("{what} of {who}"))
        };
        for (area, what, values) in [
            (
                a,
                "RTT",
                history.iter().map(|p| p.rtt_us).collect::<Vec<_>>(),
            ),
            (b, "loss", history.iter().map(|p| p.loss_permille).collect()),
            (
                c,
                "bandwidth",
                history.iter().map(|p| p.bytes_per_sec).collect(),
            ),
        ] {
            let spark = Sparkline::default()
                .block(Block::new().borders(Borders::TOP).title(title(what)))
                .data(&values);
            f.render_widget(spark, area);
        }
    }

    fn key(&mut self, code: KeyCode) -> bool {
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('r') => {
                self.sort = SortBy::Rtt;
                self.sort_sessions();
            }
            KeyCode::Char('l') => {
                self.sort = SortBy::Loss;
                self.sort_sessions();
            }
            KeyCode::Down | KeyCode::Char('j') => {
                let n = self.sessions.len();
                if n > 0 {
                    let i = self.table.selected().map_or(0, |i| (i + 1).min(n - 1));
                    self.table.select(Some(i));
                }
            }
            KeyCode::Up | KeyCode::Char('k') => {
                let i = self.table.selected().map_or(0, |i| i.saturating_sub(1));
                self.table.select(Some(i));
            }
            _ => {}
        }
        true
    }
}

fn run(terminal: &mut DefaultTerminal, mut app: App) -> anyhow::Result<()> {
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            app.refresh();
            next = Instant::now() + REFRESH;
        }
        terminal.draw(|f| app.draw(f))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press && !app.key(k.code) {
                    return Ok(());
                }
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg.is_empty() || arg == "-h" || arg == "--help" {
        println!(
            "usage: ricochet-top HOST:PORT   (a server's metrics endpoint, ServerConfig::metrics)"
        );
        println!("keys: r sort by RTT, l sort by loss, up/down select, q quit");
        return Ok(());
    }
    let addr: SocketAddr = arg
        .parse()
        .with_context(|| format!("{arg:?} is not an address like 127.0.0.1:9100"))?;
    let app = App {
        addr,
        sort: SortBy::Rtt,
        table: TableState::default(),
        last: None,
        workers: Vec::new(),
        sessions: Vec::new(),
        history: HashMap::new(),
        error: None,
    };
    let mut terminal = ratatui::init();
    let result = run(&mut terminal, app);
    ratatui::restore();
    result
}
