// The operators' console: keyboard shortcuts, and the queue pages' self-refresh (htmx polls; see tools_app/admin/queues.py).
'use strict';
{
    const NOT_TYPING = ['checkbox', 'radio', 'button', 'submit', 'reset'];
    const typing = (el) => Boolean(el) && (el.isContentEditable || ['TEXTAREA', 'SELECT'].includes(el.tagName)
                                           || (el.tagName === 'INPUT' && !NOT_TYPING.includes(el.type)));

    // A queue page may reload itself only when the operator is not in the middle of something.
    function idle() {
        if (document.querySelector('#result_list input.action-select:checked')) return false;
        const action = document.querySelector('#changelist-form select[name=action]');
        if (action && action.value) return false;
        if (typing(document.activeElement)) return false;
        if (document.querySelector('dialog[open]')) return false;
        return true;
    }

    document.addEventListener('htmx:configRequest', (event) => {
        if (event.detail.elt && event.detail.elt.id === 'queue-poll') {
            event.detail.parameters._idle = idle() ? '1' : '0';
        }
    });

    function rows() {
        return Array.from(document.querySelectorAll('#result_list tbody tr'));
    }

    function focusRow(delta) {
        const all = rows();
        if (!all.length) return;
        const current = all.findIndex((tr) => tr.classList.contains('console-focus'));
        const next = current < 0 ? 0 : Math.max(0, Math.min(all.length - 1, current + delta));
        all.forEach((tr) => tr.classList.remove('console-focus'));
        all[next].classList.add('console-focus');
        const link = all[next].querySelector('th a, td a');
        if (link) link.focus({preventScroll: false});
        all[next].scrollIntoView({block: 'nearest'});
    }

    function focusedRow() {
        return rows().find((tr) => tr.classList.contains('console-focus'));
    }

    let pendingG = false;
    document.addEventListener('keydown', (event) => {
        if (event.ctrlKey && event.key === 'Enter') {
            const form = event.target.closest && event.target.closest('#operator-action-form');
            if (form) { event.preventDefault(); form.requestSubmit(document.getElementById('confirm-action')); }
            return;
        }
        if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
        const help = document.getElementById('console-shortcuts');
        if (pendingG) {
            pendingG = false;
            const urls = JSON.parse((document.getElementById('console-urls') || {}).textContent || '{}');
            if (urls[event.key]) { event.preventDefault(); window.location.assign(urls[event.key]); }
            return;
        }
        switch (event.key) {
            case '/': {
                const box = document.getElementById('console-find-q');
                if (box) { event.preventDefault(); box.focus(); }
                break;
            }
            case '?':
                if (help) { event.preventDefault(); help.open ? help.close() : help.showModal(); }
                break;
            case 'g':
                pendingG = true;
                break;
            case 'j':
                event.preventDefault(); focusRow(1);
                break;
            case 'k':
                event.preventDefault(); focusRow(-1);
                break;
            case 'x': {
                const tr = focusedRow();
                const box = tr && tr.querySelector('input.action-select');
                if (box) { event.preventDefault(); box.click(); }
                break;
            }
        }
    });

    document.addEventListener('DOMContentLoaded', () => {
        const open = document.getElementById('console-shortcuts-open');
        const help = document.getElementById('console-shortcuts');
        if (open && help) open.addEventListener('click', (event) => { event.preventDefault(); help.showModal(); });
        // A confirmation form starts in its first field.
        const reason = document.querySelector('#operator-action-form textarea, #operator-action-form input[type=text]');
        if (reason) reason.focus();
    });
}
