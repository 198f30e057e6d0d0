// The assistant's page: the question posted to the stream URL, its server-sent events read as
// they come (text pieces, a step per tool call, the answer with its citations). Without this
// script the form posts to the page, which answers whole.
(function () {
  "use strict";
  var form = document.getElementById("assistant-form");
  if (!form || !window.fetch || !window.TextDecoder) { return; }
  var panel = document.getElementById("assistant-answer");
  var text = document.getElementById("assistant-text");
  var steps = document.getElementById("assistant-steps");
  var citations = document.getElementById("assistant-citations");
  var stopped = document.getElementById("assistant-stopped");
  var button = form.querySelector("button[type=submit]");

  function item(parent, className, content) {
    var li = document.createElement("li");
    if (className) { li.className = className; }
    li.appendChild(content);
    parent.appendChild(li);
  }

  // The answer's Markdown links to gpuadmin's own pages ("[job 42](/jobs/42/)", not "//host")
  // made links, the rest left text (assistant.views.linked does the same without script).
  var LINK = /\[([^\]\n]+)\]\((\/(?!\/)[^)\s]*)\)/g;
  function linked(answer) {
    text.textContent = "";
    var end = 0, match;
    LINK.lastIndex = 0;
    while ((match = LINK.exec(answer)) !== null) {
      text.appendChild(document.createTextNode(answer.slice(end, match.index)));
      var link = document.createElement("a");
      link.href = match[2];
      link.textContent = match[1];
      text.appendChild(link);
      end = match.index + match[0].length;
    }
    text.appendChild(document.createTextNode(answer.slice(end)));
  }

  function handle(name, data) {
    if (name === "text") {
      text.textContent += data.text;
    } else if (name === "step") {
      var code = document.createElement("code");
      code.textContent = data.name + "(" + data.arguments + ")" + (data.ok ? "" : ": " + data.error);
      item(steps, data.ok ? "ok" : "bad", code);
    } else if (name === "answer") {
      linked(data.text);
      data.citations.forEach(function (citation) {
        var link = document.createElement("a");
        link.href = citation.url;
        link.textContent = citation.ref;
        item(citations, "", link);
      });
      if (data.stopped) { stopped.textContent = "Stopped: " + data.stopped; stopped.hidden = false; }
    } else if (name === "refused") {
      stopped.textContent = data.detail;
      stopped.hidden = false;
    }
  }

  function parse(block) {
    var name = "message", data = "";
    block.split("\n").forEach(function (line) {
      if (line.indexOf("event:") === 0) { name = line.slice(6).trim(); }
      else if (line.indexOf("data:") === 0) { data += line.slice(5).trim(); }
    });
    if (data) { handle(name, JSON.parse(data)); }
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    [text, steps, citations].forEach(function (node) { node.textContent = ""; });
    stopped.hidden = true;
    panel.hidden = false;
    button.disabled = true;
    fetch(form.dataset.stream, { method: "POST", body: new FormData(form), credentials: "same-origin" })
      .then(function (response) {
        var reader = response.body.getReader();
        var decoder = new TextDecoder();
        var buffer = "";
        function pump() {
          return reader.read().then(function (chunk) {
            if (chunk.done) { if (buffer.trim()) { parse(buffer); } return; }
            buffer += decoder.decode(chunk.value, { stream: true });
            var blocks = buffer.split("\n\n");
            buffer = blocks.pop();
            blocks.forEach(parse);
            return pump();
          });
        }
        return pump();
      })
      .catch(function (error) { stopped.textContent = "The answer broke off: " + error; stopped.hidden = false; })
      .finally(function () { button.disabled = false; });
  });
})();
