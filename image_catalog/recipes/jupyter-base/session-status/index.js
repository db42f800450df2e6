// JupyterLab status bar item: the session's fGPU slice and, when the hub plans to end the session
// by itself (a lifetime, an idle timeout), the time left. CPU and memory use against the slice are
// jupyter-resource-usage's items, beside this one.
//
// What the session holds comes from the page config (`fgpuSession`, set by the image's
// jupyter_server_config.py from the spawner's environment). The planned end moves (activity
// postpones an idle end): the queue service tells this server (fgpu_session_end.py), and the item
// reads it from there.
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

const REFRESH_MS = 30 * 1000;
const TICK_MS = 15 * 1000;

function readSession() {
  try {
    return JSON.parse(PageConfig.getOption('fgpuSession') || 'null');
  } catch (e) {
    return null;
  }
}

function gib(bytes) {
  const value = bytes / 1024 ** 3;
  return (value >= 10 ? value.toFixed(0) : value.toFixed(1).replace(/\.0$/, '')) + ' GiB';
}

// "1 h 05 min", "12 min", "under a minute"
function duration(ms) {
  const minutes = Math.floor(ms / 60000);
  if (minutes < 1) return 'under a minute';
  const hours = Math.floor(minutes / 60);
  const rest = minutes % 60;
  if (hours === 0) return minutes + ' min';
  return hours + ' h ' + String(rest).padStart(2, '0') + ' min';
}

function clock(date) {
  return date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

function sliceText(session) {
  return session.fgpu > 0 ? session.fgpu + ' fGPU' : 'no GPU';
}

function endText(ends, now) {
  if (!ends || !ends.at) return '';
  const left = new Date(ends.at).getTime() - now;
  if (ends.why === 'idle') return 'stops if unused in ' + duration(Math.max(left, 0));
  return 'ends in ' + duration(Math.max(left, 0));
}

function tooltip(session, ends) {
  const lines = [
    'This session holds ' + sliceText(session) + ', ' + session.cpu + ' CPU cores and ' +
      gib(session.mem) + ' of memory.'
  ];
  if (session.fgpu > 0) lines.push('Run nvidia-smi in a terminal to see its GPU memory.');
  if (ends && ends.at) {
    const at = clock(new Date(ends.at));
    lines.push(
      ends.why === 'idle'
        ? 'Stops by itself at ' + at + ' if nobody uses it until then (' + ends.text + ').'
        : 'Ends by itself at ' + at + ' (' + ends.text + ').'
    );
  }
  lines.push('Click to open your Sessions page.');
  return lines.join('\n');
}

class SessionStatus extends Widget {
  constructor(session) {
    super();
    this.session = session;
    this.ends = null;
    this.addClass('jp-StatusBar-TextItem');
    this.addClass('fgpu-session-status');
    this.node.style.cursor = 'pointer';
    this.node.addEventListener('click', () => window.open(session.sessionsUrl, '_blank'));
    this.render();
    this.refresh();
    this._refresh = setInterval(() => this.refresh(), REFRESH_MS);
    this._tick = setInterval(() => this.render(), TICK_MS);
  }

  async refresh() {
    try {
      const settings = ServerConnection.makeSettings();
      const url = URLExt.join(settings.baseUrl, 'fgpu', 'session-end');
      const response = await ServerConnection.makeRequest(url, {}, settings);
      if (!response.ok) return;
      this.ends = (await response.json()).ends;
      this.render();
    } catch (e) {
      // The server is restarting: the slice still shows, and the next refresh tries again.
    }
  }

  render() {
    const parts = [sliceText(this.session)];
    const end = endText(this.ends, Date.now());
    if (end) parts.push(end);
    this.node.textContent = parts.join(' · ');
    this.node.title = tooltip(this.session, this.ends);
    this.node.style.color = this.ends && this.ends.warning ? 'var(--jp-warn-color0)' : '';
  }

  dispose() {
    clearInterval(this._refresh);
    clearInterval(this._tick);
    super.dispose();
  }
}

const plugin = {
  id: 'fgpu-session-status:plugin',
  description: "Shows the session's fGPU slice and the time until it ends in the status bar.",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app, statusBar) => {
    const session = readSession();
    if (!statusBar || !session) return;
    statusBar.registerStatusItem('fgpu-session-status', {
      item: new SessionStatus(session),
      align: 'left',
      rank: 100
    });
  }
};

export default plugin;
