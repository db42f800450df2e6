// The fGPU hub's items in JupyterLab, two plugins:
//
// - the status bar item: the session's fGPU slice and, when the hub plans to end the session by
//   itself (a lifetime, an idle timeout), the time left. CPU and memory use against the slice are
//   jupyter-resource-usage's items, beside this one.
// - "Run as a batch job…" on a notebook (the file browser's context menu, the File menu, the
//   command palette): it opens the Sessions page in a new tab with the batch job dialog filled in
//   for that notebook, and the student submits it there. It does not submit by itself: the queue
//   service takes a write from its own pages only (their XSRF token), never from this server's.
//
// What the session holds comes from the page config (`fgpuSession`, set by the image's
// jupyter_server_config.py from the spawner's environment). The planned end moves (activity
// postpones an idle end): the queue service tells this server (fgpu_session_end.py), and the item
// reads it from there.
import { ICommandPalette } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { IDefaultFileBrowser, IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { IMainMenu } from '@jupyterlab/mainmenu';
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

// ---- "Run as a batch job…" ------------------------------------------------------------------

const RUN_AS_JOB = 'fgpu-jobs:run-as-batch-job';

// The Sessions page with the batch dialog open on `path` (relative to the server's root, the home
// folder: a storage folder's notebook is under folders/), and this session, whose image the
// dialog picks. The page checks the path again, and the service on submit.
function jobUrl(session, path) {
  return session.sessionsUrl + '?job=' + encodeURIComponent(path) +
    '&from=' + encodeURIComponent(session.id);
}

function isNotebook(path) {
  return typeof path === 'string' && /\.ipynb$/i.test(path);
}

const jobPlugin = {
  id: 'fgpu-session-status:run-as-job',
  description: 'Opens the Sessions page to run a notebook as a batch job.',
  autoStart: true,
  optional: [IFileBrowserFactory, IDefaultFileBrowser, IMainMenu, ICommandPalette],
  activate: (app, factory, defaultBrowser, mainMenu, palette) => {
    const session = readSession();
    if (!session || !session.sessionsUrl) return;
    const contents = app.serviceManager.contents;

    // The notebook the file browser's menu was opened on (the browser selects the item a right
    // click lands on), without the drive's prefix.
    function selectedNotebook() {
      const browser = (factory && factory.tracker.currentWidget) || defaultBrowser;
      if (!browser) return null;
      for (const item of browser.selectedItems()) {
        if (item.type === 'notebook' || isNotebook(item.path)) return contents.localPath(item.path);
      }
      return null;
    }

    // The notebook open in the main area, for the File menu and the palette.
    function currentNotebook() {
      const widget = app.shell.currentWidget;
      const path = widget && widget.context && widget.context.path;
      return isNotebook(path) ? contents.localPath(path) : null;
    }

    function target(args) {
      return args && args.from === 'filebrowser' ? selectedNotebook() : currentNotebook();
    }

    app.commands.addCommand(RUN_AS_JOB, {
      // On a file browser's notebook, the item says it of that file; the File menu and the palette
      // name the notebook open in the main area.
      label: args =>
        args && args.from === 'filebrowser' ? 'Run as a batch job…' : 'Run Notebook as a Batch Job…',
      caption: 'Opens your Sessions page with this notebook in the batch job dialog: ' +
        'check the image and resources there, then submit. The job runs on a slice of its own ' +
        'and writes an executed copy of the notebook next to it.',
      isEnabled: args => !!target(args),
      execute: args => {
        const path = target(args);
        if (path) window.open(jobUrl(session, path), '_blank', 'noopener');
      }
    });
    app.contextMenu.addItem({
      command: RUN_AS_JOB,
      args: { from: 'filebrowser' },
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 3
    });
    if (mainMenu) mainMenu.fileMenu.addGroup([{ command: RUN_AS_JOB }], 40);
    if (palette) palette.addItem({ command: RUN_AS_JOB, category: 'Notebook Operations' });
  }
};

export default [plugin, jobPlugin];
