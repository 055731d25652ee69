"""Browser helpers shared by the dashboard tests (and by tests of other parts that look at the form)."""

from __future__ import annotations

from typing import Any

# Reads every hyperparameter field of the new-job form (wrappers with data-field and data-kind; the
# top-level `seed` has no data-kind): a checkbox gives its state, a group of checkboxes (a list) the
# values checked, a select its value (or, when the empty option is chosen, that option's text), a
# text box its value or, when empty, what empty means (its placeholder, shortened, and the note
# under it say it; data-null-means holds the whole text).
_READ_FORM = """() => Object.fromEntries(
    [...document.querySelectorAll('form.new-job [data-field][data-kind]')].map((wrap) => {
        const name = wrap.dataset.field;
        const input = document.getElementById('hp-' + name);
        if (wrap.dataset.kind === 'list') {
            return [name, [...input.querySelectorAll('input:checked')].map((box) => box.value)];
        }
        if (input.type === 'checkbox') return [name, input.checked];
        if (input.tagName === 'SELECT') {
            if (input.value !== '') return [name, input.value];
            return [name, input.dataset.nullMeans || input.selectedOptions[0].textContent];
        }
        return [name, input.value !== '' ? input.value : (input.dataset.nullMeans || input.placeholder)];
    }))"""


def new_job_form_defaults(page: Any) -> dict[str, str | bool | list[str]]:
    """Open the new-job form on a signed-in dashboard page and return {field name: the default it
    displays} for every rendered hyperparameter field, in the form's order."""
    page.click("#nav a[data-route=new]")
    page.wait_for_selector("form.new-job [data-field][data-kind]", state="attached")
    result: dict[str, str | bool | list[str]] = page.evaluate(_READ_FORM)
    return result
